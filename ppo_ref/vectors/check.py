"""Checking another implementation's outputs against the golden vectors.

Another implementation reads each case, runs its own code on ``inputs`` with ``settings``, and
writes a results file (``RESULTS_FORMAT = "ppo_ref.results/1"``)::

    {"format": "ppo_ref.results/1", "implementation": "my-ppo 0.3",
     "cases": {"gae_reference": {"outputs": {"advantages": [[...]], "returns": [[...]]}}, ...}}

``outputs`` uses exactly the names, nesting and shapes of the case's ``expected`` (encoded by
the rules of :mod:`ppo_ref.vectors.codec`). :func:`check_results` compares it case by case: an
output passes when every element satisfies ``|got - expected| <= atol + rtol * |expected|``
(infinities must match exactly); a case passes when all its expected outputs pass. For a
failing case whose kind has convention options, :func:`alternative_conventions` names the
conventions (and presets) under which it would pass. :func:`format_table` prints the rows.
"""
from __future__ import annotations

import itertools
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ppo_ref.config import PRESETS
from ppo_ref.conventions import OPTIONS
from ppo_ref.vectors.cases import OPTION_KEYS, compute_outputs
from ppo_ref.vectors.codec import (DEFAULT_TOLERANCE, FORMAT, RESULTS_FORMAT, decode,
                                   decode_settings, encode, read_json_file)

__all__ = ["TOLERANCE_PROFILES", "load_case", "load_cases", "reference_results",
           "check_results", "format_table", "alternative_conventions", "encode_decode",
           "flatten", "nothing_compared"]

#: Tolerance profiles of ``check``: ``float64`` keeps each case's tolerance; ``float32`` is
#: for an implementation that computes in float32 (or rounds one step to float32): every
#: case's tolerance is raised to at least this.
TOLERANCE_PROFILES = {"float64": None, "float32": {"atol": 1e-4, "rtol": 1e-4}}


# ----------------------------------------------------------------------------------------------
# Reading the vectors
# ----------------------------------------------------------------------------------------------

def _check_case_fields(raw, path: str) -> None:
    """``ValueError`` naming the case file unless it holds the fields a case needs, of the
    right JSON types (so a damaged file is one clear line, not a ``KeyError``)."""
    if not isinstance(raw, dict):
        raise ValueError(f"case file {path} must hold a JSON object")
    if raw.get("format") != FORMAT:
        raise ValueError(f"{path}: format must be {FORMAT!r}, got {raw.get('format')!r}")
    for key, kind in (("name", str), ("kind", str), ("preset", str), ("inputs", dict),
                      ("settings", dict), ("expected", dict)):
        if not isinstance(raw.get(key), kind):
            raise ValueError(f"case file {path}: {key!r} must be a JSON "
                             f"{'string' if kind is str else 'object'}, got "
                             f"{type(raw.get(key)).__name__}")
    tol = raw.get("tolerance", DEFAULT_TOLERANCE)
    if not (isinstance(tol, dict) and set(tol) == {"atol", "rtol"} and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            for v in tol.values())):
        raise ValueError(f"case file {path}: 'tolerance' must be {{'atol': number >= 0, "
                         f"'rtol': number >= 0}}, got {tol!r}")


def load_case(path: str) -> dict:
    """Read one case file; ``inputs`` and ``expected`` decoded to NumPy (settings as JSON)."""
    raw = read_json_file(path, "case file")
    _check_case_fields(raw, path)
    try:
        raw["inputs"] = decode(raw["inputs"])
        raw["settings"] = decode_settings(raw["settings"])
        raw["expected"] = decode(raw["expected"])
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"case file {path}: {exc}") from None
    return raw


def load_cases(vectors_dir: str) -> List[dict]:
    """All cases listed in ``vectors_dir/index.json``, in order."""
    index_path = os.path.join(vectors_dir, "index.json")
    if not os.path.exists(index_path):
        raise ValueError(f"vectors_dir has no index.json: {vectors_dir!r} (write it with "
                         "`ppo-ref vectors --out DIR`)")
    index = read_json_file(index_path, "vectors index")
    try:
        files = [entry["file"] for entry in index["cases"]]
    except (KeyError, TypeError):
        raise ValueError(f"vectors index {index_path} must hold {{'cases': [{{'file': ...}}, ...]}}") from None
    root = os.path.realpath(vectors_dir)
    paths = []
    for name in files:
        if not isinstance(name, str) or not name:
            raise ValueError(f"vectors index {index_path}: a case file name must be a non-empty "
                             f"string, got {name!r}")
        path = os.path.realpath(os.path.join(root, name))
        if os.path.isabs(name) or os.path.commonpath([root, path]) != root:
            raise ValueError(f"vectors index {index_path}: case file {name!r} leaves the vectors "
                             f"directory (names must be relative paths inside it)")
        paths.append(path)
    return [load_case(path) for path in paths]


# ----------------------------------------------------------------------------------------------
# Comparing
# ----------------------------------------------------------------------------------------------

def reference_results(vectors_dir: str, implementation: str = "ppo_ref") -> dict:
    """Run ppo_ref on every case's inputs and return a results document (the format another
    implementation writes). Used for the round-trip test and as an example of the layout."""
    import ppo_ref
    cases = {}
    for case in load_cases(vectors_dir):
        cases[case["name"]] = {"outputs": encode(compute_outputs(case))}
    return {"format": RESULTS_FORMAT, "implementation": f"{implementation} {ppo_ref.__version__}",
            "cases": cases}


def flatten(value, prefix="") -> Dict[str, Any]:
    """Nested outputs as ``{"grads/w_ih": array, ...}`` (the names ``skip`` lists take)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}/"))
        return out
    return {prefix[:-1]: value}


def _compare(got, expected, atol: float, rtol: float):
    """``(max_abs_err, ok, detail)`` for one output."""
    exp = np.asarray(expected, dtype=np.float64)
    try:
        g = np.asarray(got)
        if g.dtype.kind not in "biuf":  # strings ("1.5") and objects are not numbers
            return math.inf, False, "not numeric"
        g = g.astype(np.float64)
    except (TypeError, ValueError, OverflowError):
        return math.inf, False, "not numeric"
    if g.shape != exp.shape:
        return math.inf, False, f"shape {g.shape} != expected {exp.shape}"
    if exp.size == 0:
        return 0.0, True, ""
    inf_e = np.isinf(exp)
    nan_e = np.isnan(exp)
    if np.any(g[inf_e] != exp[inf_e]) or np.any(~np.isnan(g[nan_e])):
        return math.inf, False, "special values (inf/nan) differ"
    fin = ~(inf_e | nan_e)
    if np.any(~np.isfinite(g[fin])):
        return math.inf, False, "non-finite where expected is finite"
    err = np.abs(g[fin] - exp[fin])
    ok = bool(np.all(err <= atol + rtol * np.abs(exp[fin])))
    return (float(err.max()) if err.size else 0.0), ok, ""


def check_results(vectors_dir: str, results_file: str, *, atol: Optional[float] = None,
                  rtol: Optional[float] = None, allow_missing: bool = False,
                  profile: str = "float64",
                  tolerances: Optional[Mapping[str, Mapping[str, float]]] = None,
                  skip_outputs: Sequence[str] = (), explain: bool = True) -> List[dict]:
    """Compare another implementation's outputs with the vectors.

    Args:
        vectors_dir: directory written by :func:`write_vectors`.
        results_file: JSON in the results format (module docstring).
        atol, rtol: override every case's tolerance (e.g. for a float32 implementation).
        allow_missing: a case absent from the results is ``SKIP`` instead of ``MISSING``.
        profile: ``"float64"`` (each case's own tolerance) or ``"float32"`` (every tolerance
            raised to at least :data:`TOLERANCE_PROFILES` ``["float32"]``).
        tolerances: per-case and per-output overrides, ``{"<case>": {"atol": .., "rtol": ..},
            "<case>/<output>": {...}, "*/<output>": {...}}`` (the most specific wins; over
            ``atol``/``rtol`` and the profile).
        skip_outputs: output names (``"clip_fraction"``, or ``"<case>/<output>"``) an
            implementation does not produce: not compared (the row's detail lists them). A
            results case may also list its own in ``"skip": [...]``.
        explain: for a FAIL of a kind with convention options, try the other conventions
            (:func:`alternative_conventions`) and name those that would pass in ``detail``.

    Returns:
        one dict per case, in index order: ``case``, ``kind``, ``preset``, ``status``
        (``PASS``/``FAIL``/``MISSING``/``SKIP``: absent with ``allow_missing``, or every output
        skipped, so nothing was compared; ``UNKNOWN`` rows, after the index's, for case
        names in the results that the vectors do not have; outputs or keys the case does not
        expect, and strings where numbers belong, make it ``FAIL``), ``max_err`` (largest
        absolute error over the
        case's outputs; ``inf`` for a shape or special-value mismatch, ``nan`` if missing),
        ``worst`` (the output holding it), ``atol``, ``rtol``, ``detail``, ``alternatives``
        (list of conventions that would pass, for a FAIL).
    """
    if profile not in TOLERANCE_PROFILES:
        raise ValueError(f"profile must be one of {list(TOLERANCE_PROFILES)}, got {profile!r}")
    tolerances = dict(tolerances or {})
    for key, tol in tolerances.items():
        if not (isinstance(tol, Mapping) and set(tol) <= {"atol", "rtol"} and all(
                isinstance(v, (int, float)) and math.isfinite(v) and v >= 0
                for v in tol.values())):
            raise ValueError(f"tolerances[{key!r}] must be {{'atol': number >= 0, 'rtol': "
                             f"number >= 0}}, got {tol!r}")
    floor = TOLERANCE_PROFILES[profile]
    for name, tol in (("atol", atol), ("rtol", rtol)):
        if tol is not None and not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {tol!r}")
    results = read_json_file(results_file, "results file")
    if not isinstance(results, dict):
        raise ValueError(f"results file {results_file} must hold a JSON object")
    if results.get("format") != RESULTS_FORMAT:
        raise ValueError(f"results_file format must be {RESULTS_FORMAT!r}, "
                         f"got {results.get('format')!r} in {results_file}")
    got_cases = results.get("cases", {})
    if not isinstance(got_cases, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("outputs", {}), dict) for v in got_cases.values()):
        raise ValueError(f"results file {results_file}: 'cases' must map case names to "
                         "{'outputs': {...}}")
    rows = []
    for case in load_cases(vectors_dir):
        tol = case.get("tolerance", DEFAULT_TOLERANCE)
        a = tol["atol"] if atol is None else atol
        r = tol["rtol"] if rtol is None else rtol
        if floor is not None:
            a, r = max(a, floor["atol"]), max(r, floor["rtol"])
        a = tolerances.get(case["name"], {}).get("atol", a)
        r = tolerances.get(case["name"], {}).get("rtol", r)

        def output_tolerance(key, a=a, r=r, name=case["name"]):
            out_tol = {**tolerances.get(f"*/{key}", {}), **tolerances.get(f"{name}/{key}", {})}
            return out_tol.get("atol", a), out_tol.get("rtol", r)
        row = {"case": case["name"], "kind": case["kind"], "preset": case["preset"],
               "atol": a, "rtol": r, "max_err": math.nan, "worst": "", "detail": "",
               "alternatives": []}
        if case["name"] not in got_cases:
            row["status"] = "SKIP" if allow_missing else "MISSING"
            rows.append(row)
            continue
        raw_outputs = got_cases[case["name"]].get("outputs", {})
        extra_keys = sorted(set(got_cases[case["name"]]) - {"outputs", "skip"})
        own_skip = got_cases[case["name"]].get("skip", [])
        if not (isinstance(own_skip, list) and all(isinstance(x, str) for x in own_skip)):
            own_skip = []
            extra_keys.append("skip (must be a list of output names)")
        expected = flatten(case["expected"])
        skipped = sorted(k for k in expected
                         if k in own_skip or k in skip_outputs
                         or f"{case['name']}/{k}" in skip_outputs)
        known_outputs = set(expected)
        expected = {k: v for k, v in expected.items() if k not in skipped}
        try:
            got = flatten(decode(raw_outputs))
        except (ValueError, TypeError, OverflowError) as exc:
            row.update(status="FAIL", max_err=math.inf, worst="",
                       detail=f"outputs not numeric: {exc}")
            rows.append(row)
            continue
        worst, worst_key, ok, details = 0.0, "", True, []
        unexpected = sorted(set(got) - known_outputs)
        if unexpected or extra_keys:
            ok = False
            details.append("unexpected " + ", ".join(
                ([f"outputs {unexpected}"] if unexpected else [])
                + ([f"keys {extra_keys}"] if extra_keys else [])))
        for key, exp in expected.items():
            if key not in got:
                ok = False
                details.append(f"missing output {key}")
                worst, worst_key = math.inf, key
                continue
            err, good, detail = _compare(got[key], exp, *output_tolerance(key))
            if not good:
                ok = False
                details.append(f"{key}: {detail}" if detail else f"{key} out of tolerance")
            if err > worst or not worst_key:
                worst, worst_key = err, key
        if skipped:
            details.append("skipped outputs: " + ", ".join(skipped))
        if not expected and ok:  # every output skipped: no verdict
            row.update(status="SKIP", detail="every output skipped: nothing compared")
            rows.append(row)
            continue
        if not ok and explain and not unexpected and not extra_keys:
            try:
                row["alternatives"] = alternative_conventions(
                    case, {k: v for k, v in got.items() if k not in skipped}, a, r)
            except Exception:  # a results file that breaks the explanation still gets its row
                row["alternatives"] = []
            if row["alternatives"]:
                details.append("would pass under " + " | ".join(row["alternatives"]))
            else:
                details.append("no other known convention passes")
        row.update(status="PASS" if ok else "FAIL", max_err=worst, worst=worst_key,
                   detail="; ".join(details))
        rows.append(row)
    known = {row["case"] for row in rows}
    for name in got_cases:
        if name not in known:
            rows.append({"case": str(name), "kind": "", "preset": "", "status": "UNKNOWN",
                         "atol": math.nan, "rtol": math.nan, "max_err": math.nan, "worst": "",
                         "detail": "not a case of these vectors"})
    return rows


def nothing_compared(rows: List[dict]) -> bool:
    """True when no case passed or failed: every case was skipped, missing or unknown, so
    the check compared no output (``ppo-ref check`` then fails)."""
    return not any(r["status"] in ("PASS", "FAIL") for r in rows)


def _printable(text) -> str:
    """``text`` with every character that is not printable (line ends, terminal escapes) written
    as its escape (``\\n``, ``\\x1b``): a case name or detail from a results file cannot
    start a line of its own or move the cursor."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def format_table(rows: List[dict]) -> str:
    """The check rows as a fixed-width text table (one line per case, then a summary); every
    cell printable (:func:`_printable`)."""
    rows = [{k: _printable(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]
    w = max([len(r["case"]) for r in rows] + [4])
    lines = [f"{'case':<{w}}  {'kind':<22} {'preset':<9} {'status':<7} {'max |err|':>10}  "
             f"{'atol':>7} {'rtol':>7}  worst output / detail"]
    for r in rows:
        err = "" if math.isnan(r["max_err"]) else f"{r['max_err']:.3e}"
        extra = r["worst"] + (f" ({r['detail']})" if r["detail"] else "")
        tols = "" if math.isnan(r["atol"]) else f"{r['atol']:>7.0e} {r['rtol']:>7.0e}"
        lines.append(f"{r['case']:<{w}}  {r['kind']:<22} {r['preset']:<9} {r['status']:<7} "
                     f"{err:>10}  {tols:>15}  {extra}")
    counts = {status: sum(r["status"] == status for r in rows)
              for status in ("PASS", "FAIL", "MISSING", "SKIP", "UNKNOWN")}
    words = (("PASS", "passed"), ("FAIL", "failed"), ("MISSING", "missing"), ("SKIP", "skipped"),
             ("UNKNOWN", "unknown"))
    lines.append(", ".join(f"{counts[k]} {word}" for k, word in words
                           if counts[k] or k == "PASS"))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The conventions a FAIL would pass under
# ----------------------------------------------------------------------------------------------

def alternative_conventions(case: Mapping, got: Mapping[str, Any], atol: float,
                            rtol: float) -> List[str]:
    """The conventions under which ppo_ref's outputs for ``case`` equal ``got`` (flattened
    outputs, decoded) within the tolerance: each a description like ``"cleanrl/rlax
    (truncation='terminate', ...)"``. Tries every combination of the options of
    :data:`ppo_ref.conventions.OPTIONS` that the case's kind reads
    (:data:`ppo_ref.vectors.cases.OPTION_KEYS`: for a kind that is a quantity of
    :mod:`ppo_ref.testing`, the options :func:`ppo_ref.testing.identify` tries), and the case's
    own value where it is not in the table (``dual_clip=1.5``); a setting the case leaves out
    has the option's reference value. An empty list when none passes or the kind has no
    options."""
    keys = OPTION_KEYS.get(case["kind"])
    if not keys:
        return []
    table = [o for o in OPTIONS if o.name in keys]
    own = {o.name: case["settings"].get(keys[o.name], o.reference) for o in table}
    out = []
    for values in itertools.product(*(o.values + ((own[o.name],) if own[o.name] not in o.values
                                                  else ()) for o in table)):
        combo = dict(zip((o.name for o in table), values))
        if combo == own:
            continue
        settings = {**case["settings"], **{keys[k]: v for k, v in combo.items()}}
        try:
            expected = flatten(encode_decode(compute_outputs({**case, "settings": settings})))
        except ValueError:
            continue
        compared = [k for k in expected if k in got]  # skipped outputs are left out
        if compared and all(_compare(got[k], expected[k], atol, rtol)[1] for k in compared):
            text = ", ".join(f"{k}={v!r}" for k, v in combo.items())
            presets = _presets_with(case["kind"], combo)
            out.append(f"{'/'.join(presets)} ({text})" if presets else f"({text})")
    return out


def _presets_with(kind: str, combo: Mapping[str, Any]) -> List[str]:
    return [name for name, fields in PRESETS.items()
            if all(fields.get(k) == v for k, v in combo.items())]


def encode_decode(outputs):
    """Outputs as a results file carries them (encoded to JSON values and decoded back)."""
    return decode(encode(outputs))

