"""What is checked, per quantity: the reference computation, the input strategy, the outputs
and the named input properties.

An *example* is a dict of the reference function's inputs in its own layout (time-major
``[T, N]`` arrays, ``last_values`` ``[N]``) plus its hyperparameters (``gamma``, ...). The
reference result of an example under a convention (a dict of :mod:`ppo_ref.conventions`
values) is a dict ``{output name: float64 array or float}`` in data-flow order, computed by
ppo_ref in float64 from the example's (possibly float32) numbers.

Edge patterns are drawn on purpose: every step's flags are drawn from (none, terminated,
truncated, both), so both flags on one step and flags on the last row are common in small
examples; ``gamma`` and lambda are 0 or 1 with high probability; about one example in ten has
a long rollout (T = 65..2048, drawn from a seeded generator); N = 1 is the smallest env count
and the one examples shrink to; ``final_values`` and ``last_values`` are never 0, so junk is
present wherever the reference does not read them (``final_values`` is read only where a step
truncated without terminating); loss examples put a ratio exactly on ``1 +- clip_range`` and
``V - V_old`` exactly on ``+-clip_range_vf`` (float64 examples only: a float32 ratio has its
own rounding).

Sizes shrink explicitly. Hypothesis shrinks the contents of a failing example but cannot
shorten a ``[T, N]`` grid whose size was drawn before its contents (a smaller T reinterprets
every later draw), so each quantity also lists *reductions*: the same example with one env
column kept or dropped, or with a window of its rows (its elements, for the losses) kept,
smallest first. :func:`ppo_ref.testing.check` tries them after hypothesis's shrink and keeps the
smallest example on which the difference persists.

A :class:`Property` names a feature of an example (``"steps with both flags"``); the strategy
can be told to exclude it (``exclude=``), which :func:`ppo_ref.testing.identify` uses to report
"matches X except on inputs with <property>".
"""
from __future__ import annotations

import math
from typing import (Any, Callable, Dict, FrozenSet, Iterator, Mapping, NamedTuple, Optional,
                    Tuple)

import numpy as np

__all__ = ["Quantity", "Property", "QUANTITY_SPECS", "get_quantity"]


class Property(NamedTuple):
    """A named feature of an example: ``holds(example) -> bool``; excluding it removes it from
    every drawn example (``remove(example) -> example``, applied after drawing)."""
    name: str
    holds: Callable[[dict], bool]
    remove: Callable[[dict], dict]


class Quantity(NamedTuple):
    """One checked quantity.

    Attributes:
        name: ``"gae"``, ``"vtrace"``, ``"policy_loss"``, ``"value_loss"``,
            ``"normalize_advantages"``.
        outputs: output names in data-flow order (as in the reference's return value).
        reference: ``(example, options) -> {output: float64 array or float}``.
        strategy: ``(dtype, exclude, fixed) -> hypothesis strategy of examples``.
        properties: the named input properties (most specific first).
        length: ``example -> int``, the longest chain of accumulated rounding (T, or the
            number of elements of a mean), which scales the tolerance.
        reductions: ``example -> iterator of smaller examples`` (fewer envs, rows or
            elements; smallest first), tried after hypothesis's shrink.
    """
    name: str
    outputs: Tuple[str, ...]
    reference: Callable[[dict, Mapping[str, Any]], Dict[str, Any]]
    strategy: Callable[..., Any]
    properties: Tuple[Property, ...]
    length: Callable[[dict], int]
    reductions: Callable[[dict], Iterator[dict]]


def _hypothesis():
    from ppo_ref.testing._hyp import require_hypothesis
    return require_hypothesis()


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


# ----------------------------------------------------------------------------------------------
# trajectories (GAE, V-trace)
# ----------------------------------------------------------------------------------------------

_TRAJ_FLOATS = ("rewards", "values", "last_values", "final_values")
_VTRACE_FLOATS = ("behaviour_log_probs", "target_log_probs") + _TRAJ_FLOATS


def _cast(example: dict, names, dtype: str) -> dict:
    out = dict(example)
    for name in names:
        out[name] = np.asarray(out[name], dtype=np.float32 if dtype == "float32" else np.float64)
    return out


def _small_floats(st):
    return st.one_of(st.integers(-4, 4).map(float),
                     st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False))


def _nonzero_floats(st):
    """Never 0: the junk that sits where the reference does not read."""
    return st.one_of(st.sampled_from([2.0, -3.0, 5.0, 7.0]),
                     st.floats(0.5, 10.0).flatmap(lambda x: st.sampled_from([x, -x])))


def _unit(st, first=0.5):
    return st.one_of(st.sampled_from([first, 0.0, 1.0, 0.9]), st.floats(0.0, 1.0))


def _draw_trajectory(draw, st, dtype: str, exclude: FrozenSet[str], logprobs: bool) -> dict:
    """One trajectory example (float64 numbers, cast to ``dtype`` at the end)."""
    long = "a long rollout (T > 64)" not in exclude and draw(st.integers(0, 9)) == 9  # shrinks to short
    if long:
        T = draw(st.integers(65, 2048))
        N = draw(st.integers(1, 2))
        rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
        p_flag = draw(st.sampled_from([0.01, 0.05, 0.2]))
        rewards = rng.normal(size=(T, N)).round(3)
        values = rng.normal(size=(T, N)).round(3)
        terminated = rng.random((T, N)) < p_flag
        truncated = rng.random((T, N)) < p_flag
        terminated[-1] |= draw(st.booleans())
        truncated[-1] |= draw(st.booleans())
        final_values = rng.uniform(0.5, 5.0, (T, N)).round(3) * rng.choice([-1.0, 1.0], (T, N))
        last_values = rng.uniform(0.5, 5.0, N).round(3)
        ex = {}
        if logprobs:
            ex["behaviour_log_probs"] = -rng.uniform(0.1, 2.0, (T, N)).round(3)
            ex["target_log_probs"] = np.where(rng.random((T, N)) < 0.3, ex["behaviour_log_probs"],
                                              -rng.uniform(0.1, 2.0, (T, N)).round(3))
    else:
        T = draw(st.integers(1, 8))
        N = draw(st.integers(1, 3))

        def grid(elements):
            return np.array(draw(st.lists(elements, min_size=T * N, max_size=T * N)),
                            dtype=object).reshape(T, N)

        ex = {}
        if logprobs:
            lp = st.one_of(st.sampled_from([-1.0, -0.5, -2.0]), st.floats(-3.0, 0.0))
            ex["behaviour_log_probs"] = grid(lp).astype(np.float64)
            same = grid(st.booleans()).astype(bool)
            ex["target_log_probs"] = np.where(~same, ex["behaviour_log_probs"],
                                              grid(lp).astype(np.float64))
        rewards = grid(_small_floats(st)).astype(np.float64)
        values = grid(_small_floats(st)).astype(np.float64)
        kinds = grid(st.integers(0, 3)).astype(np.int64)  # none, terminated, truncated, both
        terminated = (kinds == 1) | (kinds == 3)
        truncated = (kinds == 2) | (kinds == 3)
        final_values = grid(_nonzero_floats(st)).astype(np.float64)
        last_values = np.array(draw(st.lists(_nonzero_floats(st), min_size=N, max_size=N)))
    ex.update(rewards=rewards, values=values, terminated=terminated, truncated=truncated,
              last_values=last_values, final_values=final_values, gamma=draw(_unit(st)))
    return ex


def _gae_reference(ex: dict, options: Mapping[str, Any]) -> Dict[str, Any]:
    from ppo_ref.kernels import gae
    adv, ret = gae(_f64(ex["rewards"]), _f64(ex["values"]), ex["terminated"], ex["truncated"],
                   _f64(ex["last_values"]), _f64(ex["final_values"]), gamma=float(ex["gamma"]),
                   gae_lambda=float(ex["gae_lambda"]), truncation=options["truncation"],
                   bootstrap_terminal_last_row=options["bootstrap_terminal_last_row"])
    return {"advantages": adv, "returns": ret}


def _vtrace_reference(ex: dict, options: Mapping[str, Any]) -> Dict[str, Any]:
    from ppo_ref.kernels import vtrace
    vs, pg = vtrace(_f64(ex["behaviour_log_probs"]), _f64(ex["target_log_probs"]),
                    _f64(ex["rewards"]), _f64(ex["values"]), ex["terminated"], ex["truncated"],
                    _f64(ex["last_values"]), _f64(ex["final_values"]), gamma=float(ex["gamma"]),
                    rho_bar=ex["rho_bar"], c_bar=ex["c_bar"], pg_rho_bar=ex["pg_rho_bar"],
                    lambda_=ex["lambda_"], truncation=options["truncation"],
                    bootstrap_terminal_last_row=options["bootstrap_terminal_last_row"])
    return {"vs": vs, "pg_advantages": pg}


def _apply_exclusions(ex: dict, properties, exclude) -> dict:
    for prop in properties:
        if prop.name in exclude and prop.holds(ex):
            ex = prop.remove(ex)
    return ex


def _fixed(ex: dict, fixed: Optional[Mapping[str, Any]]) -> dict:
    if fixed:
        ex = dict(ex)
        ex.update(fixed)
    return ex


def _with(ex: dict, **changes) -> dict:
    out = dict(ex)
    out.update(changes)
    return out


def _set_last_row(name: str, value: bool):
    def remove(ex):
        arr = ex[name].copy()
        arr[-1] = value
        return _with(ex, **{name: arr})
    return remove


def _lambda_key(ex):
    return "gae_lambda" if "gae_lambda" in ex else "lambda_"


_TRAJ_PROPERTIES = (
    Property("steps with both flags",
             lambda ex: bool(np.any(ex["terminated"] & ex["truncated"])),
             lambda ex: _with(ex, truncated=ex["truncated"] & ~ex["terminated"])),
    Property("a terminal step on the last row", lambda ex: bool(np.any(ex["terminated"][-1])),
             _set_last_row("terminated", False)),
    Property("a truncated step on the last row", lambda ex: bool(np.any(ex["truncated"][-1])),
             _set_last_row("truncated", False)),
    Property("gamma = 0", lambda ex: ex["gamma"] == 0.0, lambda ex: _with(ex, gamma=0.5)),
    Property("lambda = 0", lambda ex: ex[_lambda_key(ex)] == 0.0,
             lambda ex: _with(ex, **{_lambda_key(ex): 0.5})),
    Property("gamma = 1", lambda ex: ex["gamma"] == 1.0, lambda ex: _with(ex, gamma=0.5)),
    Property("lambda = 1", lambda ex: ex[_lambda_key(ex)] == 1.0,
             lambda ex: _with(ex, **{_lambda_key(ex): 0.5})),
    Property("a long rollout (T > 64)", lambda ex: ex["rewards"].shape[0] > 64,
             lambda ex: ex),  # excluded at drawing time
    Property("truncated steps", lambda ex: bool(np.any(ex["truncated"])),
             lambda ex: _with(ex, truncated=np.zeros_like(ex["truncated"]))),
)

_VTRACE_PROPERTIES = _TRAJ_PROPERTIES + (
    Property("off-policy steps (ratio != 1)",
             lambda ex: bool(np.any(ex["behaviour_log_probs"] != ex["target_log_probs"])),
             lambda ex: _with(ex, target_log_probs=ex["behaviour_log_probs"].copy())),
)


def _gae_strategy(dtype: str, exclude=frozenset(), fixed=None):
    hyp = _hypothesis()
    st = hyp.strategies

    @st.composite
    def examples(draw):
        ex = _draw_trajectory(draw, st, dtype, exclude, logprobs=False)
        ex["gae_lambda"] = draw(_unit(st, first=1.0))
        ex = _apply_exclusions(_fixed(ex, fixed), _TRAJ_PROPERTIES, exclude)
        return _cast(ex, _TRAJ_FLOATS, _pick_dtype(draw, st, dtype))
    return examples()


def _vtrace_strategy(dtype: str, exclude=frozenset(), fixed=None):
    hyp = _hypothesis()
    st = hyp.strategies

    @st.composite
    def examples(draw):
        ex = _draw_trajectory(draw, st, dtype, exclude, logprobs=True)
        ex["rho_bar"] = draw(st.sampled_from([1.0, 0.5, 2.0]))
        ex["c_bar"] = draw(st.sampled_from([1.0, 0.5, 2.0]))
        ex["pg_rho_bar"] = draw(st.sampled_from([None, 1.0, 0.5]))
        ex["lambda_"] = draw(_unit(st, first=1.0))
        ex = _apply_exclusions(_fixed(ex, fixed), _VTRACE_PROPERTIES, exclude)
        return _cast(ex, _VTRACE_FLOATS, _pick_dtype(draw, st, dtype))
    return examples()


def _pick_dtype(draw, st, dtype: str) -> str:
    if dtype == "any":
        return draw(st.sampled_from(["float64", "float32"]))
    return dtype


# ----------------------------------------------------------------------------------------------
# losses
# ----------------------------------------------------------------------------------------------

def _kink_log_ratio(old: float, d: float) -> Optional[Tuple[float, float]]:
    """``(new, clip_range)`` with ``exp(new - old)`` exactly ``1 +- clip_range`` in float64
    (checked with both ``math.exp`` and ``numpy.exp``), or None."""
    new = old + d
    r = math.exp(new - old)
    if float(np.exp(np.float64(new) - np.float64(old))) != r:
        return None
    clip = abs(r - 1.0)
    if not clip > 0.0 or (r > 1.0 and 1.0 + clip != r) or (r < 1.0 and 1.0 - clip != r):
        return None
    return new, clip


def _policy_strategy(dtype: str, exclude=frozenset(), fixed=None):
    hyp = _hypothesis()
    st = hyp.strategies

    @st.composite
    def examples(draw):
        n = draw(st.integers(1, 10))
        lp = st.one_of(st.sampled_from([-1.0, -0.5, -2.0]), st.floats(-3.0, 0.0))
        old = np.array(draw(st.lists(lp, min_size=n, max_size=n)))
        dlog = st.one_of(st.sampled_from([0.0, 0.1, -0.1, 0.5, -0.5]), st.floats(-1.0, 1.0))
        new = old + np.array(draw(st.lists(dlog, min_size=n, max_size=n)))
        adv = np.array(draw(st.lists(st.one_of(st.sampled_from([1.0, -1.0, 0.0]),
                                                _small_floats(st)), min_size=n, max_size=n)))
        clip_range = draw(st.sampled_from([0.2, 0.1, 0.3]))
        if "a ratio beyond 2 with a negative advantage" not in exclude and draw(st.booleans()):
            # the last element far out (ratio e^1.5 ~ 4.5, A < 0): where a dual clip acts
            new[-1] = old[-1] + 1.5
            adv[-1] = -abs(adv[-1]) - 0.5
        chosen = _pick_dtype(draw, st, dtype)
        if chosen == "float64" and "a ratio exactly at 1 +- clip_range" not in exclude:
            kink = draw(st.sampled_from([None, 0.2, -0.2, 0.1, -0.3]))
            if kink is not None:  # element 0 sits exactly on the kink
                made = _kink_log_ratio(float(old[0]), kink)
                if made is not None:
                    new[0], clip_range = made
        ex = {"new_log_probs": new, "old_log_probs": old, "advantages": adv,
              "clip_range": float(clip_range)}
        ex = _apply_exclusions(_fixed(ex, fixed), _POLICY_PROPERTIES, exclude)
        return _cast(ex, ("new_log_probs", "old_log_probs", "advantages"), chosen)
    return examples()


def _policy_reference(ex: dict, options: Mapping[str, Any]) -> Dict[str, Any]:
    from ppo_ref.losses import approx_kl, policy_loss
    new, old = _f64(ex["new_log_probs"]), _f64(ex["old_log_probs"])
    loss, d_new, info = policy_loss(new, old, _f64(ex["advantages"]), ex["clip_range"],
                                    clip_interval=options["clip_interval"],
                                    dual_clip=options["dual_clip"])
    kl = info["approx_kl"] if options["kl_estimator"] == "k3" else approx_kl(
        old, new, options["kl_estimator"])
    return {"loss": loss, "d_new_log_probs": d_new, "clip_fraction": info["clip_fraction"],
            "approx_kl": kl}


def _at_kink(ex) -> bool:
    r = np.exp(_f64(ex["new_log_probs"]) - _f64(ex["old_log_probs"]))
    return bool(np.any(np.abs(r - 1.0) == ex["clip_range"]))


def _far_negative(ex) -> bool:
    r = np.exp(_f64(ex["new_log_probs"]) - _f64(ex["old_log_probs"]))
    return bool(np.any((r > 2.0) & (_f64(ex["advantages"]) < 0)))


_POLICY_PROPERTIES = (
    Property("a ratio exactly at 1 +- clip_range", _at_kink, lambda ex: ex),  # at drawing time
    Property("a ratio beyond 2 with a negative advantage", _far_negative,
             lambda ex: ex),  # at drawing time
    Property("zero advantages", lambda ex: bool(np.any(ex["advantages"] == 0.0)),
             lambda ex: _with(ex, advantages=np.where(ex["advantages"] == 0.0, 1.0,
                                                      ex["advantages"]))),
    Property("a single element", lambda ex: ex["advantages"].size == 1,
             lambda ex: {k: (np.concatenate([v, v]) if isinstance(v, np.ndarray) else v)
                         for k, v in ex.items()}),
)


def _value_strategy(dtype: str, exclude=frozenset(), fixed=None):
    hyp = _hypothesis()
    st = hyp.strategies

    @st.composite
    def examples(draw):
        n = draw(st.integers(1, 10))
        floats = _small_floats(st)
        values = np.array(draw(st.lists(floats, min_size=n, max_size=n)))
        old = np.array(draw(st.lists(floats, min_size=n, max_size=n)))
        returns = np.array(draw(st.lists(floats, min_size=n, max_size=n)))
        clip = draw(st.sampled_from([None, 0.5, 0.25, 1.0]))
        if clip is not None and "V - V_old exactly at +-clip_range_vf" not in exclude:
            # dyadic old values and clip: V = V_old +- clip is exact
            for i, kind in enumerate(draw(st.lists(st.sampled_from([0, 1, -1]),
                                                   min_size=n, max_size=n))):
                if kind:
                    old[i] = float(draw(st.integers(-8, 8))) / 4.0
                    values[i] = old[i] + kind * clip
        ex = {"values": values, "old_values": old, "returns": returns, "clip_range_vf": clip}
        ex = _apply_exclusions(_fixed(ex, fixed), _VALUE_PROPERTIES, exclude)
        return _cast(ex, ("values", "old_values", "returns"), _pick_dtype(draw, st, dtype))
    return examples()


def _value_reference(ex: dict, options: Mapping[str, Any]) -> Dict[str, Any]:
    from ppo_ref.losses import value_loss
    loss, d_v = value_loss(_f64(ex["values"]), _f64(ex["old_values"]), _f64(ex["returns"]),
                           ex["clip_range_vf"], mode=options["value_loss_mode"], huber_delta=1.0)
    scale = float(options["value_loss_scale"])
    return {"loss": scale * loss, "d_values": scale * d_v}


def _vf_kink(ex) -> bool:
    c = ex["clip_range_vf"]
    return c is not None and bool(np.any(np.abs(_f64(ex["values"]) - _f64(ex["old_values"])) == c))


_VALUE_PROPERTIES = (
    Property("V - V_old exactly at +-clip_range_vf", _vf_kink, lambda ex: ex),
    Property("value clipping on", lambda ex: ex["clip_range_vf"] is not None,
             lambda ex: _with(ex, clip_range_vf=None)),
    Property("a single element", lambda ex: ex["values"].size == 1,
             lambda ex: {k: (np.concatenate([v, v]) if isinstance(v, np.ndarray) else v)
                         for k, v in ex.items()}),
)


def _normalize_strategy(dtype: str, exclude=frozenset(), fixed=None):
    hyp = _hypothesis()
    st = hyp.strategies

    @st.composite
    def examples(draw):
        n = draw(st.integers(1, 12))
        kind = draw(st.integers(0, 5))
        if kind == 0:
            adv = np.full(n, draw(_small_floats(st)))
        elif kind == 1:  # a spread near the eps values: where the eps and its placement show
            spread = draw(st.sampled_from([1e-8, 1e-7, 1e-6, 1e-5, 1e-4]))
            adv = np.array(draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n)),
                           dtype=np.float64) * spread
        else:
            adv = np.array(draw(st.lists(_small_floats(st), min_size=n, max_size=n)))
        ex = _apply_exclusions(_fixed({"advantages": adv}, fixed), _NORMALIZE_PROPERTIES, exclude)
        return _cast(ex, ("advantages",), _pick_dtype(draw, st, dtype))
    return examples()


def _normalize_reference(ex: dict, options: Mapping[str, Any]) -> Dict[str, Any]:
    from ppo_ref.losses import normalize_advantages
    return {"advantages": normalize_advantages(
        _f64(ex["advantages"]), ddof=options["advantage_norm_ddof"],
        eps=options["advantage_norm_eps"], placement=options["advantage_norm_eps_placement"])}


_NORMALIZE_PROPERTIES = (
    Property("a single element", lambda ex: ex["advantages"].size == 1,
             lambda ex: _with(ex, advantages=np.array([ex["advantages"][0], 1.0 + abs(
                 float(ex["advantages"][0]))], dtype=ex["advantages"].dtype))),
    Property("constant advantages",
             lambda ex: ex["advantages"].size > 1 and bool(np.all(ex["advantages"] ==
                                                                   ex["advantages"].flat[0])),
             lambda ex: _with(ex, advantages=ex["advantages"] + np.arange(
                 ex["advantages"].size, dtype=ex["advantages"].dtype))),
)


# ----------------------------------------------------------------------------------------------
# reductions: smaller examples cut out of a failing one
# ----------------------------------------------------------------------------------------------

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
        out = dict(ex)
        for k in _GRID_KEYS:
            if k in ex:
                out[k] = np.asarray(ex[k])[:, cols].copy()
        out["last_values"] = np.asarray(ex["last_values"])[cols].copy()
        yield out
    for rows in _windows(T):
        out = dict(ex)
        for k in _GRID_KEYS:
            if k in ex:
                out[k] = np.asarray(ex[k])[rows].copy()
        yield out


def _element_reductions(*keys: str):
    def reductions(ex: dict) -> Iterator[dict]:
        for part in _windows(int(np.asarray(ex[keys[0]]).size)):
            out = dict(ex)
            for k in keys:
                out[k] = np.asarray(ex[k])[part].copy()
            yield out
    return reductions


def _rows(ex) -> int:
    return int(np.asarray(ex["rewards"]).shape[0])


def _size(key):
    return lambda ex: int(np.asarray(ex[key]).size)


QUANTITY_SPECS: Dict[str, Quantity] = {
    "gae": Quantity("gae", ("advantages", "returns"), _gae_reference, _gae_strategy,
                    _TRAJ_PROPERTIES, _rows, _trajectory_reductions),
    "vtrace": Quantity("vtrace", ("vs", "pg_advantages"), _vtrace_reference, _vtrace_strategy,
                       _VTRACE_PROPERTIES, _rows, _trajectory_reductions),
    "policy_loss": Quantity("policy_loss", ("loss", "d_new_log_probs", "clip_fraction",
                                            "approx_kl"),
                            _policy_reference, _policy_strategy, _POLICY_PROPERTIES,
                            _size("advantages"),
                            _element_reductions("new_log_probs", "old_log_probs", "advantages")),
    "value_loss": Quantity("value_loss", ("loss", "d_values"), _value_reference, _value_strategy,
                           _VALUE_PROPERTIES, _size("values"),
                           _element_reductions("values", "old_values", "returns")),
    "normalize_advantages": Quantity("normalize_advantages", ("advantages",),
                                     _normalize_reference, _normalize_strategy,
                                     _NORMALIZE_PROPERTIES, _size("advantages"),
                                     _element_reductions("advantages")),
}


def get_quantity(name: str) -> Quantity:
    if name not in QUANTITY_SPECS:
        raise ValueError(f"quantity must be one of {list(QUANTITY_SPECS)}, got {name!r}")
    return QUANTITY_SPECS[name]
