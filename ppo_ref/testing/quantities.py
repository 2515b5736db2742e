"""What is checked, per quantity (:data:`QUANTITY_SPECS`): the reference computation
(:mod:`ppo_ref.spec`, float64), the input strategy, the outputs, the named input conditions and
the size of the numbers involved.

An *example* is a dict of the reference function's inputs in its own layout (time-major ``[T, N]``
arrays and ``last_values [N]``; flat ``[n]`` arrays for the losses and the normalization) and its
hyperparameters; a row layout adds ``_rows`` (the seed of its arrangement, 0: one row, no padding)
and adds ``_sequences`` and ``_norm`` to a loss example (its rows, for the option
``loss_aggregation``). Edge patterns are drawn on purpose: flags per step from (none, terminated,
truncated, both), gamma and lambda often 0 or 1, one example in ten a long rollout (T = 65..2048),
junk (never 0) in ``final_values``/``last_values`` wherever the reference does not read, ratios
exactly on ``1 +- clip_range`` and ``V - V_old`` exactly on ``+-clip_range_vf`` (float64), constant
advantages and spreads of 1e-8..1e-4. Hypothesis cannot shorten a ``[T, N]`` grid drawn before its
contents, so each quantity also lists *reductions* (fewer envs, rows or elements), which
:func:`ppo_ref.testing.check` tries after the shrink.
"""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import Any, Callable, Dict, FrozenSet, Iterator, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from ppo_ref.spec.losses import NORM_EPS_PLACEMENTS, eps_scale
from ppo_ref.spec.update import aggregation_weights
from ppo_ref.tiers import tier_for

__all__ = ["Quantity", "Property", "QUANTITY_SPECS", "get_quantity", "property_keys", "finish",
           "require_hypothesis"]


def require_hypothesis():
    """The ``hypothesis`` module (an optional dependency), or ``ImportError`` saying how to
    install it."""
    try:
        import hypothesis
        import hypothesis.strategies  # noqa: F401
    except ImportError as exc:
        raise ImportError("ppo_ref.testing needs the hypothesis package to draw examples: "
                          "pip install ppo_ref[testing]  (or: pip install hypothesis)") from exc
    return hypothesis


class Property(NamedTuple):
    """A named condition of an example: ``key`` (what ``exclude=`` takes, ``"both_flags"``),
    ``name`` (what messages say, ``"steps with both flags"``), ``holds(example) -> bool``,
    ``remove(example) -> example`` without it (applied after drawing), ``kink`` (an input
    exactly on a clip bound), ``broad`` (covers most examples: ``identify`` tries it last)."""
    key: str
    name: str
    holds: Callable[[dict], bool]
    remove: Callable[[dict], dict]
    kink: bool = False
    broad: bool = False


class Quantity(NamedTuple):
    """One checked quantity: ``outputs`` in data-flow order; ``reference(example, options) ->
    {output: float64 array or float}``; ``strategy(dtype, exclude, fixed, seeded)`` (hypothesis;
    ``seeded``: draw ``_rows`` too); ``properties`` (narrowest first); ``length(example)``, the
    longest accumulation (T, or the elements of a mean) and ``magnitude(example, options)``, the
    size of the numbers, which scale the tolerance; ``reductions(example)``, smaller examples,
    smallest first; ``edges``, float64 examples every search tries first."""
    name: str
    outputs: Tuple[str, ...]
    reference: Callable[[dict, Mapping[str, Any]], Dict[str, Any]]
    strategy: Callable[..., Any]
    properties: Tuple[Property, ...]
    length: Callable[[dict], int]
    reductions: Callable[[dict], Iterator[dict]]
    magnitude: Callable[[dict, Mapping[str, Any]], float]
    edges: Tuple[dict, ...] = ()


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def _input_magnitude(ex: Mapping[str, Any], options=None) -> float:
    """The largest absolute finite float among the example's inputs, at least 1."""
    m = 1.0
    for k, v in ex.items():
        if k.startswith("_"):  # a layout's arrangement, not an input
            continue
        if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
            m = max(m, float(np.max(np.abs(v))))
        elif isinstance(v, float) and math.isfinite(v):
            m = max(m, abs(v))
    return m


#: What every check compares with: the readable definitions (the compiled tier is itself checked
#: against them, tests/test_seam.py).
_REFERENCE = tier_for("spec")

_TRAJ_FLOATS = ("rewards", "values", "last_values", "final_values")
#: The float inputs of each quantity (cast to the example's dtype).
_FLOATS = {"gae": _TRAJ_FLOATS,
           "vtrace": ("behaviour_log_probs", "target_log_probs") + _TRAJ_FLOATS,
           "policy_loss": ("new_log_probs", "old_log_probs", "advantages"),
           "value_loss": ("values", "old_values", "returns"),
           "normalize_advantages": ("advantages",)}


@functools.lru_cache(maxsize=None)
def _elements(st) -> SimpleNamespace:
    """The element strategies, built once (building one per draw costs more than the draw);
    ``nonzero`` is the junk that sits where the reference does not read."""
    return SimpleNamespace(
        small=st.one_of(st.integers(-4, 4).map(float),
                        st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False)),
        nonzero=st.one_of(st.sampled_from([2.0, -3.0, 5.0, 7.0]),
                          st.tuples(st.floats(0.5, 10.0), st.booleans()).map(
                              lambda t: -t[0] if t[1] else t[0])),
        gamma=st.one_of(st.sampled_from([0.5, 0.0, 1.0, 0.9]), st.floats(0.0, 1.0)),
        lambda_=st.one_of(st.sampled_from([1.0, 0.0, 1.0, 0.9]), st.floats(0.0, 1.0)),
        log_probs=st.one_of(st.sampled_from([-1.0, -0.5, -2.0]), st.floats(-3.0, 0.0)))


def _draw_trajectory(draw, st, exclude: FrozenSet[str], dtype: str, vtrace: bool):
    """One GAE or V-trace example (float64 numbers) and its dtype."""
    el = _elements(st)
    long = "long_rollout" not in exclude and draw(st.integers(0, 9)) == 9  # shrinks to short
    if long:
        T, N = draw(st.integers(65, 2048)), draw(st.integers(1, 2))
        rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
        p_flag = draw(st.sampled_from([0.01, 0.05, 0.2]))
        rewards, values = rng.normal(size=(T, N)).round(3), rng.normal(size=(T, N)).round(3)
        terminated, truncated = rng.random((T, N)) < p_flag, rng.random((T, N)) < p_flag
        terminated[-1] |= draw(st.booleans())
        truncated[-1] |= draw(st.booleans())
        final_values = rng.uniform(0.5, 5.0, (T, N)).round(3) * rng.choice([-1.0, 1.0], (T, N))
        last_values = rng.uniform(0.5, 5.0, N).round(3)
        ex = {}
        if vtrace:
            ex["behaviour_log_probs"] = -rng.uniform(0.1, 2.0, (T, N)).round(3)
            ex["target_log_probs"] = np.where(rng.random((T, N)) < 0.3, ex["behaviour_log_probs"],
                                              -rng.uniform(0.1, 2.0, (T, N)).round(3))
    else:
        T, N = draw(st.integers(1, 8)), draw(st.integers(1, 3))

        def grid(elements):
            return np.array(draw(st.lists(elements, min_size=T * N, max_size=T * N)),
                            dtype=object).reshape(T, N)

        ex = {}
        if vtrace:
            ex["behaviour_log_probs"] = grid(el.log_probs).astype(np.float64)
            same = grid(st.booleans()).astype(bool)
            ex["target_log_probs"] = np.where(~same, ex["behaviour_log_probs"],
                                              grid(el.log_probs).astype(np.float64))
        rewards, values = (grid(el.small).astype(np.float64) for _ in range(2))
        kinds = grid(st.integers(0, 3)).astype(np.int64)  # none, terminated, truncated, both
        terminated = (kinds == 1) | (kinds == 3)
        truncated = (kinds == 2) | (kinds == 3)
        final_values = grid(el.nonzero).astype(np.float64)
        last_values = np.array(draw(st.lists(el.nonzero, min_size=N, max_size=N)))
    ex.update(rewards=rewards, values=values, terminated=terminated, truncated=truncated,
              last_values=last_values, final_values=final_values, gamma=draw(el.gamma))
    if vtrace:
        ex.update(rho_bar=draw(st.sampled_from([1.0, 0.5, 2.0])),
                  c_bar=draw(st.sampled_from([1.0, 0.5, 2.0])),
                  pg_rho_bar=draw(st.sampled_from([None, 1.0, 0.5])), lambda_=draw(el.lambda_))
    else:
        ex["gae_lambda"] = draw(el.lambda_)
    return ex, _pick_dtype(draw, st, dtype)


def _gae_reference(ex: dict, options: Mapping[str, Any]) -> Dict[str, Any]:
    adv, ret = _REFERENCE.advantages.gae(
        _f64(ex["rewards"]), _f64(ex["values"]), ex["terminated"], ex["truncated"],
        _f64(ex["last_values"]), _f64(ex["final_values"]), gamma=float(ex["gamma"]),
        gae_lambda=float(ex["gae_lambda"]), truncation=options["truncation"],
        bootstrap_terminal_last_row=options["bootstrap_terminal_last_row"])
    return {"advantages": adv, "returns": ret}


def _vtrace_reference(ex: dict, options: Mapping[str, Any]) -> Dict[str, Any]:
    vs, pg = _REFERENCE.advantages.vtrace(
        _f64(ex["behaviour_log_probs"]), _f64(ex["target_log_probs"]), _f64(ex["rewards"]),
        _f64(ex["values"]), ex["terminated"], ex["truncated"], _f64(ex["last_values"]),
        _f64(ex["final_values"]), gamma=float(ex["gamma"]), rho_bar=ex["rho_bar"],
        c_bar=ex["c_bar"], pg_rho_bar=ex["pg_rho_bar"], lambda_=ex["lambda_"],
        truncation=options["truncation"],
        bootstrap_terminal_last_row=options["bootstrap_terminal_last_row"])
    return {"vs": vs, "pg_advantages": pg}


def finish(ex: dict, quantity: str, exclude, fixed, dtype: str) -> dict:
    """Pin ``fixed``, cast the float inputs to ``dtype``, remove the excluded conditions."""
    dt = np.float32 if dtype == "float32" else np.float64
    ex = {**ex, **(fixed or {})}
    ex.update({name: np.asarray(ex[name], dtype=dt) for name in _FLOATS[quantity]})
    for prop in get_quantity(quantity).properties:
        if prop.key in exclude and prop.holds(ex):
            ex = prop.remove(ex)
    return ex


def _strategy(quantity: str, draw_example: Callable):
    """The ``strategy`` of ``quantity``: ``draw_example(draw, st, exclude, dtype) -> (example,
    its dtype)`` draws the float64 numbers, then :func:`finish` and, ``seeded``, the row seed."""
    def strategy(dtype: str, exclude=frozenset(), fixed=None, seeded=False):
        st = require_hypothesis().strategies

        @st.composite
        def examples(draw):
            ex, chosen = draw_example(draw, st, exclude, dtype)
            ex = finish(ex, quantity, exclude, fixed, chosen)
            if seeded:
                ex["_rows"] = draw(st.integers(0, 2 ** 16))
            return ex
        return examples()
    return strategy


def _set_last_row(name: str, value: bool):
    def remove(ex):
        arr = ex[name].copy()
        arr[-1] = value
        return {**ex, name: arr}
    return remove


def _hyper_equals(name: str, value: float) -> Property:
    """``gamma`` or the lambda (``gae_lambda``, V-trace's ``lambda_``) equal to ``value``;
    removed by setting it to 0.5."""
    def key(ex):
        return name if name == "gamma" else ("gae_lambda" if "gae_lambda" in ex else "lambda_")
    return Property(f"{name}_{value:g}", f"{name} = {value:g}", lambda ex: ex[key(ex)] == value,
                    lambda ex: {**ex, key(ex): 0.5})


def _take(ex: dict, index) -> dict:
    """``ex`` with each ``[T, N]`` array (:data:`_GRID_KEYS`) indexed by ``index``."""
    return {k: (np.asarray(v)[index].copy() if k in _GRID_KEYS else v) for k, v in ex.items()}


_TRAJ_PROPERTIES = (
    Property("both_flags", "steps with both flags",
             lambda ex: bool(np.any(ex["terminated"] & ex["truncated"])),
             lambda ex: {**ex, "truncated": ex["truncated"] & ~ex["terminated"]}),
    Property("terminal_last_row", "a terminal step on the last row",
             lambda ex: bool(np.any(ex["terminated"][-1])), _set_last_row("terminated", False)),
    Property("truncated_last_row", "a truncated step on the last row",
             lambda ex: bool(np.any(ex["truncated"][-1])), _set_last_row("truncated", False)),
    *(_hyper_equals(name, value) for value in (0.0, 1.0) for name in ("gamma", "lambda")),
    Property("long_rollout", "a long rollout (T > 64)", lambda ex: ex["rewards"].shape[0] > 64,
             lambda ex: _take(ex, slice(64))),
    Property("truncated", "truncated steps", lambda ex: bool(np.any(ex["truncated"])),
             lambda ex: {**ex, "truncated": np.zeros_like(ex["truncated"])}, broad=True),
)

_VTRACE_PROPERTIES = _TRAJ_PROPERTIES + (
    Property("off_policy", "off-policy steps (ratio != 1)",
             lambda ex: bool(np.any(ex["behaviour_log_probs"] != ex["target_log_probs"])),
             lambda ex: {**ex, "target_log_probs": ex["behaviour_log_probs"].copy()}, broad=True),
)


def _pick_dtype(draw, st, dtype: str) -> str:
    return draw(st.sampled_from(["float64", "float32"])) if dtype == "any" else dtype


def _kink_log_ratio(old: float, d: float) -> Optional[Tuple[float, float]]:
    """``(new, clip_range)`` with ``exp(new - old)`` exactly ``1 +- clip_range`` in float64
    (checked with both ``math.exp`` and ``numpy.exp``), or None."""
    new = old + d
    r = math.exp(new - old)
    clip = abs(r - 1.0)
    if (float(np.exp(np.float64(new) - np.float64(old))) != r or not clip > 0.0
            or (r > 1.0 and 1.0 + clip != r) or (r < 1.0 and 1.0 - clip != r)):
        return None
    return new, clip


def _draw_policy(draw, st, exclude, dtype):
    n = draw(st.integers(1, 10))
    old = np.array(draw(st.lists(_elements(st).log_probs, min_size=n, max_size=n)))
    dlog = st.one_of(st.sampled_from([0.0, 0.1, -0.1, 0.5, -0.5]), st.floats(-1.0, 1.0))
    new = old + np.array(draw(st.lists(dlog, min_size=n, max_size=n)))
    adv = np.array(draw(st.lists(st.one_of(st.sampled_from([1.0, -1.0, 0.0]),
                                            _elements(st).small), min_size=n, max_size=n)))
    clip_range = draw(st.sampled_from([0.2, 0.1, 0.3]))
    if "far_negative" not in exclude and draw(st.booleans()):
        # the last element far out (ratio e^1.5 ~ 4.5, A < 0): where a dual clip acts
        new[-1] = old[-1] + 1.5
        adv[-1] = -abs(adv[-1]) - 0.5
    chosen = _pick_dtype(draw, st, dtype)
    if chosen == "float64" and "clip_boundary" not in exclude:
        kink = draw(st.sampled_from([None, 0.2, -0.2, 0.1, -0.3]))
        if kink is not None:  # element 0 sits exactly on the kink
            made = _kink_log_ratio(float(old[0]), kink)
            if made is not None:
                new[0], clip_range = made
    return {"new_log_probs": new, "old_log_probs": old, "advantages": adv,
            "clip_range": float(clip_range)}, chosen


def _aggregated(ex: dict, options: Mapping[str, Any], n: int):
    """``(weights, factor)`` of the option ``loss_aggregation`` for a loss example
    (:func:`ppo_ref.spec.update.aggregation_weights`): its rows are ``_sequences`` where a row
    layout set them (one sequence otherwise), the norm ``_norm`` (else the element count)."""
    return aggregation_weights(options["loss_aggregation"], n, None, ex.get("_sequences"),
                               ex.get("_norm"))


def _policy_reference(ex: dict, options: Mapping[str, Any]) -> Dict[str, Any]:
    new, old = _f64(ex["new_log_probs"]), _f64(ex["old_log_probs"])
    weights, factor = _aggregated(ex, options, new.size)
    losses = _REFERENCE.losses
    loss, d_new, info = losses.policy_loss(new, old, _f64(ex["advantages"]), ex["clip_range"],
                                           clip_interval=options["clip_interval"],
                                           dual_clip=options["dual_clip"], weights=weights,
                                           clip_fraction_mode=options["clip_fraction_mode"])
    kl = info["approx_kl"] if options["kl_estimator"] == "k3" else losses.approx_kl(
        old, new, options["kl_estimator"], weights=weights)
    return {"loss": factor * loss, "d_new_log_probs": factor * d_new,
            "clip_fraction": info["clip_fraction"], "approx_kl": kl}


def _ratios(ex) -> np.ndarray:
    return np.exp(_f64(ex["new_log_probs"]) - _f64(ex["old_log_probs"]))


def _at_kink(ex) -> np.ndarray:
    return np.abs(_ratios(ex) - 1.0) == ex["clip_range"]


def _far_negative(ex) -> np.ndarray:
    return (_ratios(ex) > 2.0) & (_f64(ex["advantages"]) < 0)


def _halve_log_ratio(where: Callable[[dict], np.ndarray], key: str, base: str):
    """Remove a condition on elements by halving ``key - base`` there (until it is gone)."""
    def remove(ex):
        while np.any(where(ex)):
            arr = np.array(ex[key], dtype=np.float64)
            ref = _f64(ex[base])
            hit = where(ex)
            arr[hit] = ref[hit] + 0.5 * (arr[hit] - ref[hit])
            ex = {**ex, key: arr.astype(np.asarray(ex[key]).dtype)}
        return ex
    return remove


def _doubled(ex: dict) -> dict:
    return {k: (np.concatenate([v, v]) if isinstance(v, np.ndarray) else v)
            for k, v in ex.items()}


_POLICY_PROPERTIES = (
    Property("clip_boundary", "a ratio exactly at 1 +- clip_range",
             lambda ex: bool(np.any(_at_kink(ex))),
             _halve_log_ratio(_at_kink, "new_log_probs", "old_log_probs"), kink=True),
    Property("far_negative", "a ratio beyond 2 with a negative advantage",
             lambda ex: bool(np.any(_far_negative(ex))),
             _halve_log_ratio(_far_negative, "new_log_probs", "old_log_probs")),
    Property("zero_advantage", "zero advantages", lambda ex: bool(np.any(ex["advantages"] == 0.0)),
             lambda ex: {**ex, "advantages": np.where(ex["advantages"] == 0.0, 1.0,
                                                     ex["advantages"])}),
    Property("single_element", "a single element", lambda ex: ex["advantages"].size == 1, _doubled),
)


def _draw_value(draw, st, exclude, dtype):
    n = draw(st.integers(1, 10))
    values, old, returns = (np.array(draw(st.lists(_elements(st).small, min_size=n, max_size=n)))
                            for _ in range(3))
    clip = draw(st.sampled_from([None, 0.5, 0.25, 1.0]))
    if clip is not None and "value_clip_boundary" not in exclude:
        # dyadic old values and clip: V = V_old +- clip is exact
        for i, kind in enumerate(draw(st.lists(st.sampled_from([0, 1, -1]),
                                               min_size=n, max_size=n))):
            if kind:
                old[i] = float(draw(st.integers(-8, 8))) / 4.0
                values[i] = old[i] + kind * clip
    return ({"values": values, "old_values": old, "returns": returns, "clip_range_vf": clip},
            _pick_dtype(draw, st, dtype))


def _value_reference(ex: dict, options: Mapping[str, Any]) -> Dict[str, Any]:
    values = _f64(ex["values"])
    weights, factor = _aggregated(ex, options, values.size)
    loss, d_v = _REFERENCE.losses.value_loss(
        values, _f64(ex["old_values"]), _f64(ex["returns"]), ex["clip_range_vf"],
        mode=options["value_loss_mode"], huber_delta=1.0, weights=weights,
        boundary_grad=options["value_clip_boundary_grad"])
    scale = factor * float(options["value_loss_scale"])
    return {"loss": scale * loss, "d_values": scale * d_v}


def _vf_kink(ex) -> np.ndarray:
    c = ex["clip_range_vf"]
    if c is None:
        return np.zeros(np.shape(ex["values"]), bool)
    return np.abs(_f64(ex["values"]) - _f64(ex["old_values"])) == c


_VALUE_PROPERTIES = (
    Property("value_clip_boundary", "V - V_old exactly at +-clip_range_vf",
             lambda ex: bool(np.any(_vf_kink(ex))),
             _halve_log_ratio(_vf_kink, "values", "old_values"), kink=True),
    Property("value_clipping", "value clipping on", lambda ex: ex["clip_range_vf"] is not None,
             lambda ex: {**ex, "clip_range_vf": None}, broad=True),
    Property("single_element", "a single element", lambda ex: ex["values"].size == 1, _doubled),
)


def _draw_normalize(draw, st, exclude, dtype):
    n, kind = draw(st.integers(1, 12)), draw(st.integers(0, 5))
    if kind == 0:
        adv = np.full(n, draw(_elements(st).small))
    elif kind <= 3:  # a spread near the eps values: where the eps and its placement show
        spread = draw(st.sampled_from([1e-8, 1e-7, 1e-6, 1e-5, 1e-4]))
        steps = np.array(draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)))
        steps[-1] += n > 1 and steps.min() == steps.max()  # never constant
        adv = steps.astype(np.float64) * spread
    else:
        adv = np.array(draw(st.lists(_elements(st).small, min_size=n, max_size=n)))
    return {"advantages": adv}, _pick_dtype(draw, st, dtype)


def _normalize_reference(ex: dict, options: Mapping[str, Any]) -> Dict[str, Any]:
    return {"advantages": _REFERENCE.losses.normalize_advantages(
        _f64(ex["advantages"]), ddof=options["advantage_norm_ddof"],
        eps=options["advantage_norm_eps"], placement=options["advantage_norm_eps_placement"],
        single_element=options["advantage_norm_single_element"])}


def _normalize_magnitude(ex: dict, options: Mapping[str, Any]) -> float:
    """``max|A| / scale`` (:func:`ppo_ref.spec.losses.eps_scale`): the factor by which the
    division magnifies the rounding of ``A - mean``."""
    a = _f64(ex["advantages"]).ravel()
    m = _input_magnitude(ex)
    if a.size < 2:
        return m
    std = float(np.std(a, ddof=options["advantage_norm_ddof"]))
    eps = float(options["advantage_norm_eps"])
    placement = NORM_EPS_PLACEMENTS.index(options["advantage_norm_eps_placement"])
    return max(m, float(np.max(np.abs(a))) / eps_scale(std, eps, placement))


def _spread(ex) -> float:
    a = _f64(ex["advantages"])
    return float(a.max() - a.min()) if a.size > 1 else math.inf


def _shifted(ex):
    a = ex["advantages"]
    return {**ex, "advantages": a + np.arange(a.size, dtype=a.dtype).reshape(a.shape)}


#: one element, a constant, and a std of 1.67 x and 0.5 x each eps value (where eps and its
#: placement decide the result)
_NORMALIZE_EDGES = ({"advantages": np.array([1.5])}, {"advantages": np.full(7, 0.1)}) + tuple(
    {"advantages": scale * np.array([0.0, 1.0, -1.0, 2.0, 0.0, -3.0])}
    for eps in (1e-8, 1e-7, 1e-6, 1e-5, 1e-4) for scale in (0.3 * eps, eps))

_NORMALIZE_PROPERTIES = (
    Property("single_element", "a single element", lambda ex: ex["advantages"].size == 1,
             lambda ex: {**ex, "advantages": np.array([ex["advantages"].flat[0], 1.0 + abs(
                 float(ex["advantages"].flat[0]))], dtype=ex["advantages"].dtype)}),
    Property("constant", "constant advantages", lambda ex: _spread(ex) == 0.0, _shifted),
    Property("tiny_spread", "a spread below 1e-3 (where eps shows)",
             lambda ex: 0.0 < _spread(ex) < 1e-3, _shifted),
)


_GRID_KEYS = ("behaviour_log_probs", "target_log_probs", "rewards", "values", "terminated",
              "truncated", "final_values")


def _windows(length: int) -> Iterator[slice]:
    """Windows ``[a, a + L)`` of ``range(length)``, shortest first, ``L < length``; at most 33
    starts per length (evenly spaced) so a long rollout costs a few hundred calls at most."""
    sizes = sorted({L for L in (1, 2, 3, 4, 6, 8, 16, length // 4, length // 2,
                                (3 * length) // 4, length - 1) if 1 <= L < length})
    for L in sizes:
        step = max(1, (length - L + 1) // 32)
        for a in range(0, length - L + 1, step):
            yield slice(a, a + L)


def _trajectory_reductions(ex: dict) -> Iterator[dict]:
    """One env kept, then one env dropped, then row windows (``last_values`` follows the
    envs; a window's last row bootstraps ``last_values``)."""
    T, N = np.asarray(ex["rewards"]).shape
    keeps = [[n] for n in range(N)] + ([[m for m in range(N) if m != n] for n in range(N)]
                                      if N > 2 else [])
    for cols in keeps if N > 1 else []:
        yield {**_take(ex, (slice(None), cols)),
               "last_values": np.asarray(ex["last_values"])[cols].copy()}
    for rows in _windows(T):
        yield _take(ex, rows)


def _element_reductions(*keys: str):
    def reductions(ex: dict) -> Iterator[dict]:
        for part in _windows(int(np.asarray(ex[keys[0]]).size)):
            yield {**ex, **{k: np.asarray(ex[k])[part].copy() for k in keys}}
    return reductions


def _rows(ex) -> int:
    return int(np.asarray(ex["rewards"]).shape[0])


def _size(key):
    return lambda ex: int(np.asarray(ex[key]).size)


QUANTITY_SPECS: Dict[str, Quantity] = {q.name: q for q in (
    Quantity("gae", ("advantages", "returns"), _gae_reference,
             _strategy("gae", functools.partial(_draw_trajectory, vtrace=False)),
             _TRAJ_PROPERTIES, _rows, _trajectory_reductions, _input_magnitude),
    Quantity("vtrace", ("vs", "pg_advantages"), _vtrace_reference,
             _strategy("vtrace", functools.partial(_draw_trajectory, vtrace=True)),
             _VTRACE_PROPERTIES, _rows, _trajectory_reductions, _input_magnitude),
    Quantity("policy_loss", ("loss", "d_new_log_probs", "clip_fraction", "approx_kl"),
             _policy_reference, _strategy("policy_loss", _draw_policy), _POLICY_PROPERTIES,
             _size("advantages"), _element_reductions(*_FLOATS["policy_loss"]), _input_magnitude),
    Quantity("value_loss", ("loss", "d_values"), _value_reference,
             _strategy("value_loss", _draw_value), _VALUE_PROPERTIES, _size("values"),
             _element_reductions(*_FLOATS["value_loss"]), _input_magnitude),
    Quantity("normalize_advantages", ("advantages",), _normalize_reference,
             _strategy("normalize_advantages", _draw_normalize), _NORMALIZE_PROPERTIES,
             _size("advantages"), _element_reductions("advantages"), _normalize_magnitude,
             _NORMALIZE_EDGES),
)}


def get_quantity(name: str) -> Quantity:
    if name not in QUANTITY_SPECS:
        raise ValueError(f"quantity must be one of {list(QUANTITY_SPECS)}, got {name!r}")
    return QUANTITY_SPECS[name]


def property_keys(quantity: str, exclude) -> FrozenSet[str]:
    """``exclude`` (keys or names of the quantity's properties) as a set of keys.

    Raises:
        ValueError: an entry that names no property of ``quantity`` (the message lists them).
    """
    if isinstance(exclude, str):
        exclude = (exclude,)
    props = get_quantity(quantity).properties
    by = {**{p.name: p.key for p in props}, **{p.key: p.key for p in props}}
    out = set()
    for item in exclude or ():
        if item not in by:
            raise ValueError(f"exclude names an unknown condition {item!r} of {quantity}; "
                             "conditions: " + ", ".join(f"{p.key!r} ({p.name})" for p in props))
        out.add(by[item])
    return frozenset(out)
