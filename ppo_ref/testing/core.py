"""``check_*``, :class:`Mismatch` and :func:`identify`.

A check draws examples (:mod:`ppo_ref.testing.quantities`), hands each to the user's function
through a layout (:mod:`ppo_ref.testing.layouts`), and compares every output with ppo_ref's
result under the chosen convention. The first differing example is shrunk by hypothesis (its
contents), then cut down to fewer envs, rows or elements for as long as the same kind of
difference persists (the quantity's reductions), and raised as :class:`Mismatch`.

Tolerance. With ``L`` the length of the longest accumulation (T for GAE/V-trace, the number of
elements of a mean for the losses) and ``M`` the magnitude involved (the largest absolute
value among the example's float inputs and the expected output, at least 1), an output passes
when ``|got - expected| <= 16 * u * M * (L + 1)`` elementwise, ``u`` the unit roundoff of the
check (float64: 2**-53, or float32: 2**-24 when the example's arrays are float32). A gap is
*precision-sized* when it stays within the same bound with float32's ``u``: the size of the
error a single float32 step (a rounded gamma, a float32 ratio) leaves; larger gaps are logic
differences. :func:`identify` searches with that float32 bound as its tolerance (``loose``)
to tell a convention matched up to float32 rounding from one that differs in logic.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ppo_ref.testing._hyp import require_hypothesis
from ppo_ref.testing.layouts import Layout, get_layout
from ppo_ref.conventions import (combinations, describe, options_for,
                                     resolve_convention)
from ppo_ref.testing.quantities import get_quantity

__all__ = ["Mismatch", "check_gae", "check_vtrace", "check_policy_loss", "check_value_loss",
           "check_normalize_advantages", "check", "identify", "IdentifyReport",
           "DEFAULT_MAX_EXAMPLES"]

DEFAULT_MAX_EXAMPLES = 100
_U64 = 2.0 ** -53
_U32 = 2.0 ** -24
_DTYPES = ("float64", "float32", "any")


class Mismatch(AssertionError):
    """The user's function and the reference differ on an example.

    Attributes:
        quantity: the checked quantity (``"gae"``, ...).
        output: the first differing output in data-flow order (``"advantages"``, ...), or
            ``None`` when ``fn`` raised or an output is missing.
        index: the first differing index (a tuple; ``()`` for a scalar output), or ``None``.
        expected: the reference's value there (``None`` when ``fn`` raised).
        actual: ``fn``'s value there (or the exception ``fn`` raised).
        precision: True when the gap is float32-rounding sized (see the module docstring),
            False for a logic difference.
        example: the shrunk, minimal example: ``{input name: value}`` in the reference layout.
        convention: the options the reference used.
        alternatives: descriptions of other conventions under which the reference gives
            ``fn``'s outputs on this example (empty when none does).
        properties: the named properties of the example (``"steps with both flags"``, ...).
        tolerance, gap: the allowed and the observed absolute difference.
    """

    def __init__(self, message: str = "", **fields: Any):
        super().__init__(message)
        self.quantity = fields.get("quantity")
        self.output = fields.get("output")
        self.index = fields.get("index")
        self.expected = fields.get("expected")
        self.actual = fields.get("actual")
        self.precision = bool(fields.get("precision", False))
        self.example = fields.get("example")
        self.convention = fields.get("convention")
        self.alternatives: List[str] = list(fields.get("alternatives", ()))
        self.properties: List[str] = list(fields.get("properties", ()))
        self.tolerance = fields.get("tolerance")
        self.gap = fields.get("gap")
        self.raised = fields.get("raised")

    def __str__(self) -> str:
        return self.args[0] if self.args else ""


class _Found(Exception):
    """Raised inside the hypothesis search; carries the mismatch fields of one example."""

    def __init__(self, fields: dict):
        super().__init__(fields.get("output"))
        self.fields = fields


# ----------------------------------------------------------------------------------------------
# comparing one example
# ----------------------------------------------------------------------------------------------

def _magnitude(ex: Mapping[str, Any], expected) -> float:
    m = 1.0
    for v in list(ex.values()) + [expected]:
        if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
            m = max(m, float(np.max(np.abs(v))))
        elif isinstance(v, float) and math.isfinite(v):
            m = max(m, abs(v))
    return m


def _is_float32(ex: Mapping[str, Any]) -> bool:
    floats = [v for v in ex.values() if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
    return bool(floats) and all(v.dtype == np.float32 for v in floats)


def _compare_outputs(quantity, got: Mapping[str, Any], expected: Mapping[str, Any], ex,
                     skip: Iterable[str], loose: bool = False,
                     seen: Optional[dict] = None) -> Optional[dict]:
    """Fields of the first difference (outputs in data-flow order), or None.

    ``loose``: the float32 bound is the tolerance (only logic differences count); a gap
    between the strict and the float32 bound then sets ``seen["rounding"] = True``."""
    q = get_quantity(quantity)
    length = q.length(ex)
    u = _U32 if _is_float32(ex) else _U64
    for name in q.outputs:
        if name in skip or name not in expected:
            continue
        exp = np.asarray(expected[name], dtype=np.float64)
        if name not in got:
            return {"output": name, "index": None, "expected": expected[name], "actual": None,
                    "precision": False, "gap": math.inf, "tolerance": 0.0,
                    "missing": True}
        try:
            act = np.asarray(got[name], dtype=np.float64)
        except (TypeError, ValueError):
            return {"output": name, "index": None, "expected": exp, "actual": got[name],
                    "precision": False, "gap": math.inf, "tolerance": 0.0,
                    "bad_shape": "not numeric"}
        if act.shape != exp.shape:
            return {"output": name, "index": None, "expected": exp, "actual": act,
                    "precision": False, "gap": math.inf, "tolerance": 0.0,
                    "bad_shape": f"shape {act.shape}, expected {exp.shape}"}
        mag = _magnitude(ex, exp)
        tol = 16.0 * u * mag * (length + 1)
        band32 = 16.0 * _U32 * mag * (length + 1)
        with np.errstate(invalid="ignore"):
            gap = np.abs(act - exp)
        bad = ~(gap <= tol)  # nan counts as a difference
        if loose and np.any(bad):
            logic = ~(gap <= band32)
            if not np.any(logic):
                if seen is not None:
                    seen["rounding"] = True
                continue
            bad, tol = logic, band32
        if np.any(bad):
            idx = tuple(int(i) for i in np.argwhere(bad)[0]) if exp.ndim else ()
            g = float(gap[idx])
            return {"output": name, "index": idx, "expected": float(exp[idx]),
                    "actual": float(act[idx]), "precision": bool(g <= band32),
                    "gap": g, "tolerance": tol}
    return None


def _run_one(fn, quantity: str, layout, ex: Mapping[str, Any], options: Mapping[str, Any],
             skip, loose: bool = False, seen: Optional[dict] = None) -> Optional[dict]:
    q = get_quantity(quantity)
    expected = layout.expected(quantity, q.reference(ex, options), ex)
    args, kwargs = layout.arguments(quantity, ex)
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:  # the user's function failing on valid input is a finding
        return {"output": None, "index": None, "expected": None, "actual": exc,
                "precision": False, "gap": math.inf, "tolerance": 0.0, "raised": exc}
    got = layout.outputs(quantity, result, ex)
    return _compare_outputs(quantity, got, expected, ex, skip, loose, seen)


# ----------------------------------------------------------------------------------------------
# the search
# ----------------------------------------------------------------------------------------------

def _kind(fields: dict) -> tuple:
    """What a difference is, for keeping a reduced example: the same kind must persist."""
    if fields.get("raised") is not None:
        return ("raised", type(fields["raised"]))
    if fields.get("missing"):
        return ("missing", fields["output"])
    if fields.get("bad_shape"):
        return ("bad_shape", fields["output"])
    return ("precision",) if fields["precision"] else ("logic",)


def _reduce(fn, quantity: str, layout, options, ex: dict, fields: dict, skip, *,
            loose: bool, exclude, fixed) -> Tuple[dict, dict]:
    """The smallest example reachable from ``ex`` by the quantity's reductions (fewer envs,
    rows or elements) on which ``fn`` still differs in the same way; greedy: the first
    (smallest) reduction that keeps the difference is taken, then reductions of it are tried."""
    q = get_quantity(quantity)
    if fixed and any(isinstance(v, np.ndarray) for v in fixed.values()):
        return ex, fields  # a pinned array cannot be cut consistently
    kind = _kind(fields)
    changed = True
    while changed:
        changed = False
        for smaller in q.reductions(ex):
            if any(p.name in exclude and p.holds(smaller) for p in q.properties):
                continue
            found = _run_one(fn, quantity, layout, smaller, options, skip, loose=loose)
            if found is not None and _kind(found) == kind:
                ex, fields, changed = smaller, found, True
                break
    return ex, fields


def _search(fn, quantity: str, layout, options, *, dtype: str, max_examples: int, skip,
            exclude=frozenset(), fixed=None, shrink: bool = True, loose: bool = False,
            seen: Optional[dict] = None) -> Optional[Tuple[dict, dict]]:
    """Run hypothesis; ``(example, fields)`` of the first difference (shrunk to a minimal one
    and then reduced when ``shrink``), or None. ``loose``, ``seen``: as
    :func:`_compare_outputs`."""
    hyp = require_hypothesis()
    q = get_quantity(quantity)
    strategy = q.strategy(dtype, frozenset(exclude), fixed)
    last: Dict[str, Any] = {}

    @hyp.settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                  print_blob=False, suppress_health_check=list(hyp.HealthCheck),
                  report_multiple_bugs=False,
                  phases=tuple(hyp.Phase) if shrink else (hyp.Phase.explicit,
                                                          hyp.Phase.generate))
    @hyp.given(strategy)
    def prop(ex):
        fields = _run_one(fn, quantity, layout, ex, options, skip, loose, seen)
        if fields is not None:
            last["example"], last["fields"] = ex, fields
            raise _Found(fields)

    try:
        prop()
    except _Found:
        # hypothesis re-runs the minimal example last, so `last` holds it
        if not shrink:
            return last["example"], last["fields"]
        return _reduce(fn, quantity, layout, options, last["example"], last["fields"], skip,
                       loose=loose, exclude=frozenset(exclude), fixed=fixed)
    return None


def _properties(quantity: str, ex) -> List[str]:
    return [p.name for p in get_quantity(quantity).properties if p.holds(ex)]


def _alternatives(fn, quantity: str, layout, ex, options, skip,
                  rounded_too: bool = False) -> List[str]:
    """Other conventions under which ``fn``'s outputs on ``ex`` equal the reference's exactly;
    with ``rounded_too`` (for a logic difference) also those it equals up to float32 rounding,
    which the description then says."""
    out, rounded = [], []
    for combo in combinations(quantity):
        if all(combo[k] == options.get(k) for k in combo):
            continue
        trial = {**options, **combo}
        if _run_one(fn, quantity, layout, ex, trial, skip) is None:
            out.append(describe(quantity, combo))
        elif rounded_too and _run_one(fn, quantity, layout, ex, trial, skip,
                                      loose=True) is None:
            rounded.append(describe(quantity, combo) + " (up to float32 rounding)")
    return out + rounded


def _format_value(v) -> str:
    if isinstance(v, np.ndarray):
        if v.size > 24:
            return f"<{v.dtype} array of shape {v.shape}>"
        text = np.array2string(v, separator=", ", max_line_width=10 ** 6)
        return text + ("" if v.dtype in (np.float64, np.bool_) else f"  ({v.dtype})")
    return repr(v)


def _message(quantity: str, fn, fields: dict, ex: dict, convention_text: str,
             alternatives: List[str], properties: List[str], layout) -> str:
    name = getattr(fn, "__name__", repr(fn))
    lines = []
    if fields.get("raised") is not None:
        exc = fields["raised"]
        lines.append(f"{quantity}: {name} raised {type(exc).__name__}: {exc}")
    elif fields.get("missing"):
        lines.append(f"{quantity}: {name} does not return {fields['output']!r} (pass "
                     f"skip=({fields['output']!r},) if it does not produce it)")
    elif fields.get("bad_shape"):
        lines.append(f"{quantity}: {fields['output']} of {name}: {fields['bad_shape']}")
    else:
        kind = ("a precision-sized gap (float32 rounding)" if fields["precision"]
                else "a logic difference, larger than float32 rounding")
        lines.append(f"{quantity}: {fields['output']}{list(fields['index'])} differs: "
                     f"{name} gives {fields['actual']!r}, the reference ({convention_text}) "
                     f"gives {fields['expected']!r}; |diff| = {fields['gap']:.3g} > tolerance "
                     f"{fields['tolerance']:.3g}: {kind}")
    lines.append(f"minimal input (reference layout; {name} was called through layout "
                 f"{getattr(layout, 'name', type(layout).__name__)!r}):")
    for k, v in ex.items():
        lines.append(f"    {k} = {_format_value(v)}")
    if properties:
        lines.append("this input has: " + "; ".join(properties))
    if alternatives:
        lines.append(f"on this input {name} agrees with another convention: "
                     + " | ".join(alternatives))
    elif fields.get("raised") is None and not fields.get("missing"):
        lines.append(f"no other known convention gives {name}'s outputs on this input")
    return "\n".join(lines)


def check(fn, quantity: str, *, layout: Union[str, Layout] = "reference",
          convention: Union[str, Mapping[str, Any]] = "reference", dtype: str = "float64",
          max_examples: Optional[int] = None, skip: Sequence[str] = (),
          fixed: Optional[Mapping[str, Any]] = None) -> None:
    """Fuzz ``fn`` against the reference ``quantity``; the ``check_*`` functions call this.

    Raises:
        Mismatch: on the first (shrunk) difference.
        ValueError: an unknown quantity, layout, convention, dtype or skipped output.
        ImportError: hypothesis is not installed (``pip install ppo_ref[testing]``).
    """
    q = get_quantity(quantity)
    lay = get_layout(layout, quantity)
    options = resolve_convention(convention)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {dtype!r}")
    skip = tuple(skip)
    for name in skip:
        if name not in q.outputs:
            raise ValueError(f"skip names an unknown output {name!r} of {quantity}; outputs: "
                             f"{list(q.outputs)}")
    n = DEFAULT_MAX_EXAMPLES if max_examples is None else int(max_examples)
    if n < 1:
        raise ValueError(f"max_examples must be >= 1, got {max_examples!r}")
    found = _search(fn, quantity, lay, options, dtype=dtype, max_examples=n, skip=skip,
                    fixed=fixed)
    if found is None:
        return None
    ex, fields = found
    relevant = {o.name: options[o.name] for o in options_for(quantity)}
    convention_text = describe(quantity, relevant)
    alternatives = [] if fields.get("raised") is not None else _alternatives(
        fn, quantity, lay, ex, options, skip, rounded_too=not fields["precision"])
    props = _properties(quantity, ex)
    message = _message(quantity, fn, fields, ex, convention_text, alternatives, props,
                       lay)
    raise Mismatch(message, quantity=quantity, example=ex, convention=relevant,
                   alternatives=alternatives, properties=props,
                   **{k: v for k, v in fields.items() if k in (
                       "output", "index", "expected", "actual", "precision", "gap",
                       "tolerance", "raised")})


_CHECK_DOC = """Fuzz ``fn`` against ppo_ref's ``{ref}`` and raise :class:`Mismatch` on a difference.

    Args:
        fn: the implementation under test, called through ``layout``.
        layout: a layout name ({layouts}) or a :class:`~ppo_ref.testing.layouts.Layout`.
        convention: a preset name of ``PPOConfig.preset`` or a dict of options
            (:data:`ppo_ref.conventions.OPTIONS`) the reference uses; options it leaves out
            keep their reference value.
        dtype: ``"float64"``, ``"float32"`` (every float array is float32 and the tolerance is
            float32's) or ``"any"`` (both are drawn).
        max_examples: examples to try (default {n}); each failing one is then shrunk.
        skip: outputs ``fn`` does not produce (outputs: {outputs}).
        fixed: ``{{input name: value}}`` pinned in every example (e.g. ``{{"c_bar": 1.0}}``
            for an implementation without that parameter).

    Raises:
        Mismatch: with the minimal example, the first differing output and index, both values,
            whether the gap is precision-sized, and the other conventions ``fn`` agrees with on
            that example.
        ValueError: an unknown layout, convention option, dtype or output name.
        ImportError: hypothesis is missing (``pip install ppo_ref[testing]``).
    """


def _make_check(quantity: str, ref: str, layouts: str):
    def checker(fn, *, layout="reference", convention="reference", dtype="float64",
                max_examples=None, skip=(), fixed=None):
        return check(fn, quantity, layout=layout, convention=convention, dtype=dtype,
                     max_examples=max_examples, skip=skip, fixed=fixed)
    checker.__name__ = checker.__qualname__ = f"check_{quantity}"
    checker.__doc__ = _CHECK_DOC.format(ref=ref, layouts=layouts, n=DEFAULT_MAX_EXAMPLES,
                                        outputs=", ".join(get_quantity(quantity).outputs))
    return checker


_TRAJ_LAYOUTS = ("reference, next_values, episode_starts, dones, discounts, env_major, "
                 "normalized_outputs (GAE only)")
check_gae = _make_check("gae", "ppo_ref.gae", _TRAJ_LAYOUTS)
check_vtrace = _make_check("vtrace", "ppo_ref.vtrace", _TRAJ_LAYOUTS)
check_policy_loss = _make_check("policy_loss", "ppo_ref.losses.policy_loss", "reference")
check_value_loss = _make_check("value_loss", "ppo_ref.losses.value_loss", "reference")
check_normalize_advantages = _make_check("normalize_advantages",
                                         "ppo_ref.losses.normalize_advantages", "reference")


# ----------------------------------------------------------------------------------------------
# identify
# ----------------------------------------------------------------------------------------------

class IdentifyReport:
    """Result of :func:`identify`.

    Attributes:
        quantity: the quantity examined.
        matches: option dicts under which every drawn example agreed within the strict
            (float64) tolerance, reference values first.
        precision_only: option dicts under which every drawn example agreed up to
            float32-rounding-sized gaps (and some gap exceeded the strict tolerance): the
            implementation has a float32 step but the same logic.
        except_on: ``[(options, property name, rounded)]``: conventions that agree on every
            example without that property (``rounded``: only up to float32 rounding), from
            the most specific property that gives any; searched whenever ``matches`` is empty
            (when ``precision_only`` is not empty, only the strict ones are kept: a float32
            match already covers the rest).
        counterexample: the :class:`Mismatch` against the reference convention when nothing
            matches (its ``example`` is minimal), else None.
    """

    def __init__(self, quantity, matches, except_on, counterexample, precision_only):
        self.quantity = quantity
        self.matches = matches
        self.except_on = except_on
        self.counterexample = counterexample
        self.precision_only = precision_only

    @property
    def verdict(self) -> str:
        """``"match"``, ``"match_float32"`` (only up to float32 rounding), ``"match_except"``
        or ``"none"``."""
        if self.matches:
            return "match"
        if self.precision_only:
            return "match_float32"
        if self.except_on:
            return "match_except"
        return "none"

    def __str__(self) -> str:
        q = self.quantity
        if self.matches:
            text = f"{q}: matches " + describe(q, self.matches[0])
            if len(self.matches) > 1:
                text += "; also indistinguishable on the drawn examples: " + "; ".join(
                    describe(q, m) for m in self.matches[1:])
            return text
        lines = [f"{q}: matches {describe(q, o)} (up to float32 rounding)"
                 for o in self.precision_only]
        lines += [f"{q}: matches {describe(q, o)}{' (up to float32 rounding)' if r else ''} "
                  f"except on inputs with {p}" for o, p, r in self.except_on]
        if lines:
            return "\n".join(lines)
        return f"{q}: no known convention matches; minimal counterexample against the " \
               f"reference convention:\n{self.counterexample}"

    __repr__ = __str__


def identify(fn, quantity: str, *, layout: Union[str, Layout] = "reference",
             dtype: str = "float64", max_examples: Optional[int] = None, skip: Sequence[str] = (),
             fixed: Optional[Mapping[str, Any]] = None) -> IdentifyReport:
    """Which convention does ``fn`` implement?

    Tries every combination of the options of :data:`ppo_ref.conventions.OPTIONS` that
    affect ``quantity`` (a search of ``max_examples`` examples each, default 60) with the
    float32 bound as the tolerance, and sorts each into: an exact match (no gap beyond the
    strict float64 tolerance), a match up to float32 rounding (gaps only of float32-rounding
    size: a float32 step in otherwise the same logic), or a logic difference. Exact matches
    are preferred. Without one, it re-runs each combination that differs in logic with the
    example strategy told to exclude one named input property at a time (most specific first;
    only the properties its counterexample has) and reports "matches X except on inputs with
    <property>", or "matches X (up to float32 rounding) except on inputs with <property>"
    when the agreement off that property is itself float32-sized (e.g. an implementation that
    rounds gamma to float32 and bootstraps steps with both flags). With none of these it
    reports "no known convention matches" with the minimal counterexample against the
    reference.

    Returns:
        :class:`IdentifyReport`; ``str(report)`` names the options (and the presets sharing
        them).

    Raises:
        ValueError, ImportError: as the ``check_*`` functions.
    """
    q = get_quantity(quantity)
    lay = get_layout(layout, quantity)
    n = 60 if max_examples is None else int(max_examples)
    skip = tuple(skip)
    base = resolve_convention("reference")

    def search(combo, exclude=frozenset()):
        """(found or None, rounded): a loose search; rounded when a float32-sized gap showed."""
        seen: Dict[str, bool] = {}
        found = _search(fn, quantity, lay, {**base, **combo}, dtype=dtype, max_examples=n,
                        skip=skip, exclude=exclude, fixed=fixed, shrink=False, loose=True,
                        seen=seen)
        return found, bool(seen.get("rounding"))

    matches, failures, precision_only = [], [], []
    for combo in combinations(quantity):
        found, rounded = search(combo)
        if found is not None:
            failures.append((combo, found))
        elif rounded:
            precision_only.append(combo)
        else:
            matches.append(combo)
    except_on: List[Tuple[dict, str, bool]] = []
    counterexample = None
    if not matches:
        # the most specific property first; within it, the conventions in table order
        for prop in q.properties:
            for combo, (ex, _) in failures:
                if not prop.holds(ex):
                    continue
                found, rounded = search(combo, exclude=frozenset({prop.name}))
                if found is None and not (rounded and precision_only):
                    except_on.append((combo, prop.name, rounded))
            if except_on:
                break
        if not except_on and not precision_only:
            try:
                check(fn, quantity, layout=lay, convention="reference", dtype=dtype,
                      max_examples=n, skip=skip, fixed=fixed)
            except Mismatch as m:
                counterexample = m
    return IdentifyReport(quantity, matches, except_on, counterexample, precision_only)
