"""``check_*``, :class:`Mismatch` and :func:`identify`.

A check draws examples (:mod:`ppo_ref.testing.quantities`), hands each to the user's function
through a layout (:mod:`ppo_ref.testing.layouts`) and compares every output with the reference
under the chosen convention; the first difference is shrunk by hypothesis, then cut down to fewer
envs, rows or elements while the same kind of difference persists. No false pass: each call gets
fresh copies of its inputs, compared with a second copy afterwards; outputs must be real floats
of the expected shape; a call slower than ``deadline`` twice in a row stops the check.

Tolerance: an output passes when ``|got - expected| <= 16 * u * M * (L + 1)`` elementwise, ``L``
the quantity's ``length`` (longest accumulation), ``M`` its ``magnitude`` (at least the largest
expected output, and 1), ``u`` the unit roundoff (2**-53; 2**-24 for float32 examples). A gap
within the bound with float32's ``u`` is *precision-sized*; larger gaps are logic differences
(``loose``: :func:`identify` takes the float32 bound as the tolerance).
"""
from __future__ import annotations

import copy
import inspect
import math
import time
import traceback
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ppo_ref._checks import result_dtype
from ppo_ref.conventions import combinations, describe, options_for, resolve_convention
from ppo_ref.testing.layouts import LAYOUTS, BadOutput, Layout, as_numpy, get_layout
from ppo_ref.testing.quantities import (Quantity, finish, get_quantity, property_keys,
                                        require_hypothesis)

__all__ = ["Mismatch", "check_gae", "check_vtrace", "check_policy_loss", "check_value_loss",
           "check_normalize_advantages", "check", "identify", "IdentifyReport",
           "DEFAULT_MAX_EXAMPLES", "DEFAULT_DEADLINE"]

DEFAULT_MAX_EXAMPLES = 100
#: Seconds one call of the function under test may take (twice in a row) before the check stops.
DEFAULT_DEADLINE = 5.0
_U64, _U32 = 2.0 ** -53, 2.0 ** -24  # the unit roundoff of float64 and of float32
_DTYPES = ("float64", "float32", "any")
_FIELDS = ("output", "index", "expected", "actual", "precision", "gap", "tolerance", "raised",
           "mutated", "seconds")


class Mismatch(AssertionError):
    """The user's function and the reference differ on an example.

    Attributes: ``quantity``; ``output``, ``index`` (a tuple, ``()`` for a scalar), ``expected``
    and ``actual`` of the first difference in data-flow order (None when ``fn`` raised, wrote
    into an input or was too slow); ``precision`` (the gap is float32-rounding sized, module
    docstring), ``kink_only`` (every example without an input exactly on a clip bound agrees);
    ``example`` (the minimal ``{input name: value}``, reference layout); ``convention`` (the
    options used); ``alternatives`` (other conventions giving ``fn``'s outputs on it);
    ``properties`` (its named conditions); ``tolerance``, ``gap``; ``raised`` (what ``fn``
    raised), ``mutated`` (the input it wrote into), ``seconds`` (a call over the deadline)."""

    def __init__(self, message: str = "", **fields: Any):
        super().__init__(message)
        for name in ("quantity", "example", "convention", *_FIELDS):
            setattr(self, name, fields.get(name))
        self.precision = bool(self.precision)
        self.kink_only = bool(fields.get("kink_only", False))
        self.alternatives: List[str] = list(fields.get("alternatives", ()))
        self.properties: List[str] = list(fields.get("properties", ()))


class _Found(Exception):
    """Raised inside the hypothesis search on a difference (the search keeps its fields)."""


def _named(fn, args, kwargs) -> List[Tuple[str, Any]]:
    """``(parameter name, value)`` of every argument (``argument i`` where unnamed)."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [params[i].name if i < len(params) else f"argument {i + 1}" for i in range(len(args))]
    return list(zip(names, args)) + list(kwargs.items())


def _change(before, after) -> Optional[str]:
    """How ``after`` differs from the copy ``before`` (None: it does not)."""
    if isinstance(before, np.ndarray):
        if not isinstance(after, np.ndarray) or after.shape != before.shape:
            return f"its shape became {np.shape(after)}"
        if before.tobytes() == after.tobytes():
            return None
        same = before == after
        if before.dtype.kind in "fc":
            same |= np.isnan(before) & np.isnan(after)
        idx = tuple(int(i) for i in np.argwhere(~same)[0]) if not same.all() else None
        if idx is None:
            return "in its bits (a sign of zero)"
        return f"at index {list(idx)}: {before[idx].item()!r} became {after[idx].item()!r}"
    if isinstance(before, (list, dict)):
        if len(after) != len(before):
            return f"its length became {len(after)}"
        for k in range(len(before)) if isinstance(before, list) else before:
            inner = _change(before[k], after[k]) if isinstance(after, list) or k in after \
                else "lost an entry"
            if inner:
                return f"[{k!r}] {inner}"
    return None


def _real(value) -> Tuple[Optional[np.ndarray], Optional[str]]:
    """``(float64 array, None)`` for real floating-point numbers (an int is accepted for a
    scalar), else ``(None, what it is)``."""
    if isinstance(value, BadOutput):
        return None, str(value)
    value = as_numpy(value)
    try:
        arr = np.asarray(value)
    except Exception:
        return None, f"not an array ({type(value).__name__})"
    kind = arr.dtype.kind
    if kind == "f" or (arr.ndim == 0 and kind in "iu"):
        return arr.astype(np.float64), None
    what = {"c": "complex", "b": "boolean", "U": "string", "S": "bytes", "O": "object"}.get(
        kind, str(arr.dtype))
    return None, f"{what} {'array' if arr.ndim else 'value'} ({arr.dtype}), not real floats"


def _fail(**fields) -> dict:
    return {"output": None, "index": None, "expected": None, "actual": None,
            "precision": False, "gap": math.inf, "tolerance": 0.0, **fields}


def _compare_outputs(q: Quantity, got: Mapping[str, Any], expected: Mapping[str, Any], ex,
                     options, skip, loose: bool = False, seen: Optional[dict] = None
                     ) -> Optional[dict]:
    """Fields of the first difference (outputs in data-flow order), or None.

    ``loose``: the float32 bound is the tolerance (only logic differences count); a gap
    between the strict and the float32 bound then sets ``seen["rounding"] = True``."""
    length = q.length(ex)
    arrays = [v for v in ex.values() if isinstance(v, np.ndarray)]
    u = _U32 if result_dtype(*arrays) == np.float32 else _U64
    base = q.magnitude(ex, options)
    for name in q.outputs:
        if name in skip or name not in expected:
            continue
        exp = np.asarray(expected[name], dtype=np.float64)
        if name not in got:
            return _fail(output=name, expected=expected[name], missing=True)
        act, problem = _real(got[name])
        if problem is None and act.shape != exp.shape:
            problem = f"shape {act.shape}, expected {exp.shape}"
        if problem is not None:
            return _fail(output=name, expected=exp, actual=got[name], bad_shape=problem)
        mag = max(base, float(np.max(np.abs(exp))) if exp.size else 0.0)
        tol = 16.0 * u * mag * (length + 1)
        band32 = 16.0 * _U32 * mag * (length + 1)
        with np.errstate(invalid="ignore"):
            gap = np.asarray(np.abs(act - exp))
        # equal infinities and NaN where NaN is expected agree; any other nan is a difference
        gap[(act == exp) | (np.isnan(act) & np.isnan(exp))] = 0.0
        bad = ~(gap <= tol)
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
                    "actual": float(act[idx]), "precision": bool(g <= band32), "gap": g,
                    "tolerance": tol}
    return None


def _kind(fields: dict) -> tuple:
    """What a difference is, for keeping a reduced example: the same kind must persist."""
    for key in ("raised", "mutated", "seconds"):
        if fields.get(key) is not None:
            return (key, type(fields[key]) if key == "raised" else fields[key])
    if fields.get("missing") or fields.get("bad_shape"):
        return ("output", fields["output"])
    return ("precision",) if fields["precision"] else ("logic",)


def _decided(layout) -> Dict[str, Any]:
    """The options ``layout`` fixes (``decided_options()``, else ``decides`` at their
    reference values)."""
    method = getattr(layout, "decided_options", None)
    if method is not None:
        return dict(method())
    ref = resolve_convention("reference")
    return {k: ref[k] for k in getattr(layout, "decides", ())}


def _combos(quantity: str, layout) -> List[Dict[str, Any]]:
    """The option combinations of ``quantity`` (:func:`ppo_ref.conventions.combinations`) that
    leave the options the layout decides at their values; a layout without rows (not
    ``seeded``) also keeps ``loss_aggregation`` at its reference (one sequence)."""
    fixed = {} if getattr(layout, "seeded", False) else {
        "loss_aggregation": resolve_convention("reference")["loss_aggregation"]}
    fixed.update(_decided(layout))
    return [c for c in combinations(quantity) if all(c.get(k, v) == v for k, v in fixed.items())]


def _format_value(v) -> str:
    if isinstance(v, np.ndarray):
        if v.size > 24:
            return f"<{v.dtype} array of shape {v.shape}>"
        text = np.array2string(v, separator=", ", max_line_width=10 ** 6)
        return text + ("" if v.dtype in (np.float64, np.bool_) else f"  ({v.dtype})")
    if isinstance(v, list) and len(v) <= 8 and all(isinstance(x, np.ndarray) for x in v):
        return "[" + ", ".join(_format_value(x) for x in v) + "]"
    return repr(v)


def _first_line(quantity: str, name: str, fields: dict, convention_text: str,
                deadline, max_examples: int) -> str:
    if fields.get("raised") is not None:
        exc = fields["raised"]
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if len(frames) > 1 else ""
        return f"{quantity}: {name} raised {type(exc).__name__}: {exc}{where}"
    if fields.get("mutated") is not None:
        return (f"{quantity}: {name} wrote into its input {fields['mutated']!r}: "
                f"{fields['change']} (the check passes a copy and compares it afterwards; "
                "a function under test must not modify its inputs)")
    if fields.get("seconds") is not None:
        s = fields["seconds"]
        return (f"{quantity}: one call of {name} took {s:.1f} s (twice in a row), over the "
                f"deadline of {deadline:g} s per call: {max_examples} examples would take "
                f"about {s * max_examples / 60:.0f} min. Pass deadline=None (or a larger "
                "deadline) to allow it")
    if fields.get("missing"):
        return (f"{quantity}: {name} does not return {fields['output']!r} (pass "
                f"skip=({fields['output']!r},) if it does not produce it)")
    if fields.get("bad_shape"):
        what = f"{fields['output']} of {name}" if fields["output"] else f"{name}"
        return f"{quantity}: {what}: {fields['bad_shape']}"
    kind = ("a precision-sized gap (float32 rounding)" if fields["precision"]
            else "a logic difference, larger than float32 rounding")
    return (f"{quantity}: {fields['output']}{list(fields['index'])} differs: {name} gives "
            f"{fields['actual']!r}, the reference ({convention_text}) gives "
            f"{fields['expected']!r}; |diff| = {fields['gap']:.3g} > tolerance "
            f"{fields['tolerance']:.3g}: {kind}")


class _Run:
    """``fn`` against the reference ``quantity`` through ``layout``: the arguments :func:`check`
    and :func:`identify` share, checked (ValueError names a bad one), and the calls, searches
    and the :class:`Mismatch` both make."""

    def __init__(self, fn, quantity: str, layout, dtype: str, max_examples, skip, fixed,
                 exclude, deadline, default_examples: int):
        self.q = get_quantity(quantity)
        self.layout = get_layout(layout, quantity)
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {dtype!r}")
        self.skip = tuple(skip)
        for name in self.skip:
            if name not in self.q.outputs:
                raise ValueError(f"skip names an unknown output {name!r} of {quantity}; "
                                 f"outputs: {list(self.q.outputs)}")
        self.excluded = property_keys(quantity, exclude)
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(
                deadline, (int, float)) or not deadline > 0):
            raise ValueError(f"deadline must be a number of seconds > 0 or None, got "
                             f"{deadline!r}")
        self.n = default_examples if max_examples is None else int(max_examples)
        if self.n < 1:
            raise ValueError(f"max_examples must be >= 1, got {max_examples!r}")
        self.fn, self.dtype, self.fixed = fn, dtype, fixed
        self.deadline = None if deadline is None else float(deadline)

    def prepared(self, ex: dict) -> dict:
        """``ex`` as the layout states it (its ``prepare``, where it has one)."""
        prepare = getattr(self.layout, "prepare", None)
        return prepare(self.q.name, ex) if prepare is not None else ex

    def call(self, ex: dict) -> Tuple[Any, Optional[dict]]:
        """``(result, None)``, or ``(None, fields)`` when ``fn`` raised, wrote into an input or
        took longer than ``deadline`` seconds twice."""
        for attempt in (0, 1):
            args, kwargs = self.layout.arguments(self.q.name, copy.deepcopy(ex))
            before = copy.deepcopy((args, kwargs))
            start = time.perf_counter()
            try:
                result = self.fn(*args, **kwargs)
            except Exception as exc:  # the user's function failing on valid input is a finding
                return None, {"raised": exc}
            seconds = time.perf_counter() - start
            for (name, b), (_, a) in zip(_named(self.fn, *before), _named(self.fn, args, kwargs)):
                change = _change(b, a)
                if change:
                    return None, {"mutated": name, "change": change}
            if self.deadline is None or seconds <= self.deadline:
                return result, None
        return None, {"seconds": seconds}

    def one(self, ex: dict, options: Mapping[str, Any], loose: bool = False,
            seen: Optional[dict] = None) -> Optional[dict]:
        """Fields of the first difference of ``fn`` on ``ex`` under ``options``, or None
        (``loose``, ``seen``: :func:`_compare_outputs`)."""
        q, layout = self.q, self.layout
        ex = self.prepared(ex)
        expected = layout.expected(q.name, q.reference(ex, options), ex)
        result, failure = self.call(ex)
        if failure is not None:
            return _fail(**failure)
        try:
            got = layout.outputs(q.name, result, ex)
        except Exception as exc:  # a result the layout cannot read
            return _fail(bad_shape=f"its result cannot be read through layout "
                                   f"{getattr(layout, 'name', '?')!r}: {exc}")
        return _compare_outputs(q, got, expected, ex, options, self.skip, loose, seen)

    def search(self, options: Mapping[str, Any], exclude: frozenset, shrink: bool = True,
               loose: bool = False, seen: Optional[dict] = None) -> Optional[Tuple[dict, dict]]:
        """Run hypothesis on examples without the conditions ``exclude``; ``(example, fields)``
        of the first difference (shrunk to a minimal one, then reduced, when ``shrink``), or
        None."""
        hyp = require_hypothesis()
        q = self.q
        seeded = bool(getattr(self.layout, "seeded", False))
        last: Dict[str, Any] = {}
        phases = [hyp.Phase.explicit, hyp.Phase.reuse, hyp.Phase.generate, hyp.Phase.target]
        phases += [hyp.Phase.shrink] if shrink else []

        @hyp.settings(max_examples=self.n, deadline=None, derandomize=True, database=None,
                      print_blob=False, suppress_health_check=list(hyp.HealthCheck),
                      report_multiple_bugs=False, phases=phases)
        @hyp.given(q.strategy(self.dtype, exclude, self.fixed, seeded))
        def prop(ex):
            slow = last.get("fields", {}).get("seconds") is not None  # then no more calls
            fields = last["fields"] if slow else self.one(ex, options, loose, seen)
            if fields is not None:
                if not slow:
                    last["example"], last["fields"] = ex, fields
                raise _Found()

        edge_dtype = "float32" if self.dtype == "float32" else "float64"  # for "any": float64
        for edge in q.edges:  # tried first
            ex = finish(edge, q.name, exclude, self.fixed, edge_dtype)
            prop = hyp.example(ex={**ex, "_rows": 0} if seeded else ex)(prop)
        try:
            with warnings.catch_warnings():  # hypothesis's note on a long example's repr
                warnings.simplefilter("ignore", hyp.errors.HypothesisWarning)
                prop()
        except _Found:
            # hypothesis re-runs the minimal example last, so `last` holds it
            if not shrink or last["fields"].get("seconds") is not None:
                return last["example"], last["fields"]
            return self.reduce(options, last["example"], last["fields"], loose, exclude)
        return None

    def reduce(self, options, ex: dict, fields: dict, loose: bool, exclude) -> Tuple[dict, dict]:
        """The smallest example reachable from ``ex`` by the quantity's reductions (fewer envs,
        rows or elements) on which ``fn`` still differs in the same way; greedy: the first
        (smallest) reduction that keeps the difference is taken, then reductions of it are
        tried."""
        if fields.get("seconds") is not None or (
                self.fixed and any(isinstance(v, np.ndarray) for v in self.fixed.values())):
            return ex, fields  # a slow call is not cut down; a pinned array cannot be cut
        kind = _kind(fields)
        changed = True
        while changed:
            changed = False
            for smaller in self.q.reductions(ex):
                if any(p.key in exclude and p.holds(smaller) for p in self.q.properties):
                    continue
                found = self.one(smaller, options, loose)
                if found is not None and _kind(found) == kind:
                    ex, fields, changed = smaller, found, True
                    break
        return ex, fields

    def alternatives(self, ex: dict, options, rounded_too: bool = False) -> List[str]:
        """Other conventions under which ``fn``'s outputs on ``ex`` equal the reference's
        exactly; with ``rounded_too`` (for a logic difference) also those it equals up to
        float32 rounding, which the description then says."""
        out, rounded = [], []
        for combo in _combos(self.q.name, self.layout):
            if all(combo[k] == options.get(k) for k in combo):
                continue
            trial = {**options, **combo}
            if self.one(ex, trial) is None:
                out.append(describe(self.q.name, combo))
            elif rounded_too and self.one(ex, trial, loose=True) is None:
                rounded.append(describe(self.q.name, combo) + " (up to float32 rounding)")
        return out + rounded

    def fail(self, ex: dict, fields: dict, convention: Optional[dict] = None, alternatives=(),
             kink_only: bool = False):
        """Raise the :class:`Mismatch` of ``fields`` on the prepared example ``ex``: the
        difference, the kinks, the minimal input (also as passed to ``fn``), its conditions and
        the conventions ``fn`` agrees with; ``convention``: the options compared with (None:
        ``fn`` matches no convention, in :func:`identify`)."""
        __tracebackhide__ = True
        q, layout = self.q, self.layout
        name = getattr(self.fn, "__name__", repr(self.fn))
        text = "" if convention is None else describe(q.name, convention)
        lines = [_first_line(q.name, name, fields, text, self.deadline, self.n)]
        held = [p for p in q.properties if p.holds(ex)]
        kinks = [p for p in held if p.kink]
        if kink_only:
            lines.append("the difference is confined to exact kinks: every example without "
                         + " or ".join(p.name for p in kinks) + " agrees (exclude="
                         + repr(tuple(p.key for p in kinks)) + " looks past it)")
        lay_name = getattr(layout, "name", type(layout).__name__)
        lines.append(f"minimal input (reference layout; {name} was called through layout "
                     f"{lay_name!r}):")
        lines += [f"    {k} = {_format_value(v)}" for k, v in ex.items() if not k.startswith("_")]
        if lay_name != "reference":
            args, kwargs = layout.arguments(q.name, copy.deepcopy(ex))
            lines.append(f"as passed to {name}:")
            lines += [f"    {k} = {_format_value(v)}" for k, v in _named(self.fn, args, kwargs)]
        if held:
            lines.append("this input has: " + "; ".join(f"{p.name} ({p.key!r})" for p in held))
        if alternatives:
            lines.append(f"on this input {name} agrees with another convention: "
                         + " | ".join(alternatives))
        elif not any(fields.get(k) for k in ("raised", "missing", "bad_shape", "mutated")):
            lines.append(f"no other known convention gives {name}'s outputs on this input")
        message = lines[0] if fields.get("seconds") is not None else "\n".join(lines)
        raise Mismatch(message, quantity=q.name, example=ex, convention=convention,
                       alternatives=alternatives, properties=[p.name for p in held],
                       kink_only=kink_only, **{k: v for k, v in fields.items() if k in _FIELDS})


def check(fn, quantity: str, *, layout: Union[str, Layout] = "reference",
          convention: Union[str, Mapping[str, Any]] = "reference", dtype: str = "float64",
          max_examples: Optional[int] = None, skip: Sequence[str] = (),
          fixed: Optional[Mapping[str, Any]] = None, exclude: Sequence[str] = (),
          deadline: Optional[float] = DEFAULT_DEADLINE) -> None:
    """Fuzz ``fn`` against the reference ``quantity`` (``"gae"``, ...): the ``check_*``
    functions (:func:`check_gae` documents the arguments and what is raised)."""
    __tracebackhide__ = True  # pytest: the test's line, then the message
    run = _Run(fn, quantity, layout, dtype, max_examples, skip, fixed, exclude, deadline,
               DEFAULT_MAX_EXAMPLES)
    decided = _decided(run.layout)
    if isinstance(convention, Mapping):
        for name, value in convention.items():
            if name in decided and value != decided[name]:
                hint = " (pass MaskedRows(aggregation=...))" if name == "loss_aggregation" else ""
                raise ValueError(f"convention sets {name}={value!r}, but layout "
                                 f"{getattr(run.layout, 'name', type(run.layout).__name__)!r} "
                                 f"fixes {name}={decided[name]!r}{hint}")
    options = {**resolve_convention(convention), **decided}
    found = run.search(options, run.excluded)
    if found is None:
        return None
    raw, fields = found
    ex = run.prepared(raw)
    value_gap = fields.get("index") is not None
    kinks = frozenset(p.key for p in run.q.properties if p.kink) - run.excluded
    kink_only = value_gap and any(p.holds(ex) for p in run.q.properties if p.key in kinks)
    if kink_only:  # does every example without an exact kink agree?
        kink_only = run.search(options, run.excluded | kinks, shrink=False) is None
    alternatives = run.alternatives(raw, options, not fields["precision"]) if value_gap else []
    run.fail(ex, fields, {o.name: options[o.name] for o in options_for(quantity)}, alternatives,
             kink_only)


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
        exclude: input conditions no example has, to look past a known difference (keys:
            {conditions}).
        deadline: seconds one call of ``fn`` may take (default {deadline:g}; a call over it,
            twice in a row, stops the check with a message); None: no limit.

    Raises:
        Mismatch: with the minimal example, the first differing output and index, both values,
            whether the gap is precision-sized or confined to exact kinks, and the other
            conventions ``fn`` agrees with on that example; also when ``fn`` raises, writes
            into an input, returns anything but real floats of the expected shape, or is
            slower than ``deadline``.
        ValueError: an unknown layout, convention option, dtype, output name or condition,
            a convention option the layout fixes to another value (``masked_rows``: the
            truncation options, ``loss_aggregation``), or a bad deadline or max_examples.
        ImportError: hypothesis is missing (``pip install ppo_ref[testing]``).
    """


def _make_check(quantity: str, ref: str):
    def checker(fn, *, layout="reference", convention="reference", dtype="float64",
                max_examples=None, skip=(), fixed=None, exclude=(), deadline=DEFAULT_DEADLINE):
        __tracebackhide__ = True
        return check(fn, quantity, layout=layout, convention=convention, dtype=dtype,
                     max_examples=max_examples, skip=skip, fixed=fixed, exclude=exclude,
                     deadline=deadline)
    q = get_quantity(quantity)
    checker.__name__ = checker.__qualname__ = f"check_{quantity}"
    layouts = ", ".join(name for name, lay in LAYOUTS.items() if quantity in lay.quantities)
    checker.__doc__ = _CHECK_DOC.format(
        ref=ref, layouts=layouts, n=DEFAULT_MAX_EXAMPLES, outputs=", ".join(q.outputs),
        conditions=", ".join(repr(p.key) for p in q.properties), deadline=DEFAULT_DEADLINE)
    return checker


check_gae = _make_check("gae", "ppo_ref.gae")
check_vtrace = _make_check("vtrace", "ppo_ref.vtrace")
check_policy_loss = _make_check("policy_loss", "ppo_ref.spec.losses.policy_loss")
check_value_loss = _make_check("value_loss", "ppo_ref.spec.losses.value_loss")
check_normalize_advantages = _make_check("normalize_advantages",
                                         "ppo_ref.spec.losses.normalize_advantages")


class IdentifyReport:
    """Result of :func:`identify`.

    Attributes: ``quantity``; ``matches`` (option dicts under which every example agreed within
    the float64 tolerance, reference values first); ``precision_only`` (those that agreed only
    up to float32 rounding: the same logic with a float32 step); ``except_on`` (``[(options,
    condition names, rounded)]``: agreement on every example without one or two conditions,
    searched when nothing matches; with a ``precision_only`` match only strict ones are kept);
    ``counterexample`` (the minimal :class:`Mismatch` against the reference convention when
    nothing matches); ``excluded`` (the condition names ``exclude=`` left out)."""

    def __init__(self, quantity, matches, except_on, counterexample, precision_only,
                 excluded=()):
        self.quantity, self.matches, self.except_on = quantity, matches, except_on
        self.counterexample, self.precision_only = counterexample, precision_only
        self.excluded = list(excluded)

    @property
    def verdict(self) -> str:
        """``"match"``, ``"match_float32"`` (only up to float32 rounding), ``"match_except"``
        or ``"none"``."""
        for verdict, found in (("match", self.matches), ("match_float32", self.precision_only),
                               ("match_except", self.except_on)):
            if found:
                return verdict
        return "none"

    def __str__(self) -> str:
        q = self.quantity
        tail = f" (inputs without {' or '.join(self.excluded)})" if self.excluded else ""
        if self.matches:
            text = f"{q}: matches " + describe(q, self.matches[0]) + tail
            if len(self.matches) > 1:
                text += "; also indistinguishable on the drawn examples: " + "; ".join(
                    describe(q, m) for m in self.matches[1:])
            return text
        lines = [f"{q}: matches {describe(q, o)} (up to float32 rounding){tail}"
                 for o in self.precision_only]
        lines += [f"{q}: matches {describe(q, o)}{' (up to float32 rounding)' if r else ''} "
                  f"except on inputs with {' or with '.join(p)}{tail}"
                  for o, p, r in self.except_on]
        if lines:
            return "\n".join(lines)
        return (f"{q}: no known convention matches{tail}; minimal counterexample against the "
                f"reference convention:\n{self.counterexample}")

    __repr__ = __str__


def _except_on(properties, failures, search, precision_only):
    """Conventions that agree once one or two conditions are excluded: a single narrow
    condition first, then two narrow ones, then a broad one, then two with a broad one (pairs
    only without a float32 match). A pair is tried where excluding its first condition left a
    counterexample with the second."""
    followups: Dict[Tuple[int, str], dict] = {}  # (failure, excluded key): its counterexample
    tried = set()

    def first_agreeing(pool, candidates) -> list:
        """The agreements ``(combo, names, rounded)`` for the first ``first`` of ``pool`` whose
        ``candidates(first, pool)`` (``(failure index, conditions)``) give any."""
        for first in pool:
            out = []
            for i, props in candidates(first, pool):
                combo = failures[i][0]
                found, rounded = search(combo, {p.key for p in props})
                if found is not None and len(props) == 1:
                    followups[(i, first.key)] = found[0]
                names = tuple(p.name for p in sorted(props, key=properties.index))
                if found is None and not (rounded and precision_only) and (
                        combo, names, rounded) not in out:
                    out.append((combo, names, rounded))
            if out:
                return out
        return []

    def singles(first, pool):
        return [(i, (first,)) for i, (_, ex) in enumerate(failures) if first.holds(ex)]

    def pairs(first, pool):
        for (i, key), ex in list(followups.items()):
            if key == first.key:  # the follow-ups of excluding the first condition alone
                for second in pool:
                    pair = (i, frozenset({first.key, second.key}))
                    if second.key != first.key and pair not in tried and second.holds(ex):
                        tried.add(pair)
                        yield i, (first, second)

    narrow = [p for p in properties if not p.broad]
    broad = [p for p in properties if p.broad]
    if precision_only:  # a float32 match is the answer; only strict single exceptions add to it
        return first_agreeing(narrow, singles) or first_agreeing(broad, singles)
    return (first_agreeing(narrow, singles) or first_agreeing(narrow, pairs)
            or first_agreeing(broad, singles) or first_agreeing(list(properties), pairs))


def identify(fn, quantity: str, *, layout: Union[str, Layout] = "reference",
             dtype: str = "float64", max_examples: Optional[int] = None, skip: Sequence[str] = (),
             fixed: Optional[Mapping[str, Any]] = None, exclude: Sequence[str] = (),
             deadline: Optional[float] = DEFAULT_DEADLINE) -> IdentifyReport:
    """Which convention does ``fn`` implement?

    Searches every combination of the :data:`ppo_ref.conventions.OPTIONS` that affect
    ``quantity`` (less those the layout decides; ``max_examples`` each, default 60) with the
    float32 bound, sorting each into an exact match, a match up to float32 rounding, or a logic
    difference. Without an exact match, those that differ in logic are searched again with one or
    two conditions of their counterexample excluded (:func:`_except_on`); failing all, the
    minimal counterexample against the reference. The other arguments are the checks'.

    Returns an :class:`IdentifyReport` (``str(report)`` names the options and the presets
    sharing them). Raises as the ``check_*`` functions (a function that raises, writes into its
    inputs, returns no readable output or is too slow matches nothing: :class:`Mismatch`)."""
    __tracebackhide__ = True
    run = _Run(fn, quantity, layout, dtype, max_examples, skip, fixed, exclude, deadline, 60)
    q, excluded, base = run.q, run.excluded, resolve_convention("reference")

    def search(combo, extra=frozenset()):
        """(found or None, rounded): a loose search; rounded when a float32-sized gap showed."""
        seen: Dict[str, bool] = {}
        found = run.search({**base, **combo}, excluded | frozenset(extra), shrink=False,
                           loose=True, seen=seen)
        if found is not None and _kind(found[1])[0] not in ("precision", "logic"):
            run.fail(run.prepared(found[0]), found[1])
        return found, bool(seen.get("rounding"))

    matches, failures, precision_only = [], [], []
    for combo in _combos(quantity, run.layout):
        found, rounded = search(combo)
        if found is not None:
            failures.append((combo, found[0]))
        elif rounded:
            precision_only.append(combo)
        else:
            matches.append(combo)
    except_on: List[Tuple[dict, Tuple[str, ...], bool]] = []
    counterexample = None
    if not matches:
        except_on = _except_on([p for p in q.properties if p.key not in excluded], failures,
                               search, precision_only)
        if not except_on and not precision_only:
            try:
                check(fn, quantity, layout=run.layout, convention="reference", dtype=dtype,
                      max_examples=run.n, skip=run.skip, fixed=fixed, exclude=tuple(excluded),
                      deadline=run.deadline)
            except Mismatch as m:
                counterexample = m
    names = [p.name for p in q.properties if p.key in excluded]
    return IdentifyReport(quantity, matches, except_on, counterexample, precision_only, names)

