"""Checking another implementation's outputs against the golden vectors.

The other implementation writes a results file (``RESULTS_FORMAT = "ppo_ref.results/1"``)::

    {"format": "ppo_ref.results/1", "implementation": "my-ppo 0.3",
     "cases": {"gae_reference": {"outputs": {"advantages": [[...]], "returns": [[...]]}}, ...}}

``outputs`` has exactly the names, nesting and shapes of the case's ``expected`` (encoded by
:mod:`ppo_ref.vectors.codec`). An output passes when every element satisfies ``|got - expected|
<= atol + rtol * |expected|`` (infinities and nan must match exactly); a case passes when all
its compared outputs pass.
"""
from __future__ import annotations

import itertools
import math
import os
from typing import Any, List, Mapping, Optional, Sequence

import numpy as np

from ppo_ref.config import PRESETS
from ppo_ref.conventions import OPTIONS
from ppo_ref.vectors.cases import OPTION_KEYS, compute_outputs
from ppo_ref.vectors.codec import (DEFAULT_TOLERANCE, FORMAT, RESULTS_FORMAT, decode,
                                   decode_settings, encode, flatten, read_json_file)

__all__ = ["TOLERANCE_PROFILES", "load_case", "load_cases", "reference_results",
           "check_results", "format_table", "alternative_conventions", "encode_decode",
           "flatten", "nothing_compared"]

#: ``float64`` keeps each case's tolerance; ``float32`` (an implementation computing in float32,
#: or rounding one step to it) raises every tolerance to at least these.
TOLERANCE_PROFILES = {"float64": None, "float32": {"atol": 1e-4, "rtol": 1e-4}}
_STATUSES = (("PASS", "passed"), ("FAIL", "failed"), ("MISSING", "missing"),
             ("SKIP", "skipped"), ("UNKNOWN", "unknown"))


def _is_bound(value) -> bool:
    """True for a finite number >= 0 (a bool is not one)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def _is_tolerance(tol) -> bool:
    """True for ``{"atol": bound, "rtol": bound}`` with either key optional."""
    return (isinstance(tol, Mapping) and set(tol) <= {"atol", "rtol"}
            and all(_is_bound(v) for v in tol.values()))


def load_case(path: str) -> dict:
    """Read one case file; ``inputs`` and ``expected`` decoded to NumPy, special floats of the
    settings decoded. ``ValueError`` naming the file when it is not a case (a field missing or of
    the wrong JSON type, a bad tolerance, arrays that do not decode); ``OSError`` when it cannot
    be read."""
    raw = read_json_file(path, "case file")
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
    if not (_is_tolerance(tol) and len(tol) == 2):
        raise ValueError(f"case file {path}: 'tolerance' must be {{'atol': number >= 0, "
                         f"'rtol': number >= 0}}, got {tol!r}")
    try:
        raw["inputs"] = decode(raw["inputs"])
        raw["settings"] = decode_settings(raw["settings"])
        raw["expected"] = decode(raw["expected"])
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"case file {path}: {exc}") from None
    return raw


def load_cases(vectors_dir: str) -> List[dict]:
    """Every case listed in ``vectors_dir/index.json``, in order (:func:`load_case`).
    ``ValueError``: no or a malformed index, or a case file name that leaves the directory."""
    index_path = os.path.join(vectors_dir, "index.json")
    if not os.path.exists(index_path):
        raise ValueError(f"vectors_dir has no index.json: {vectors_dir!r} (write it with "
                         "`ppo-ref vectors --out DIR`)")
    index = read_json_file(index_path, "vectors index")
    try:
        files = [entry["file"] for entry in index["cases"]]
    except (KeyError, TypeError):
        raise ValueError(f"vectors index {index_path} must hold "
                         "{'cases': [{'file': ...}, ...]}") from None
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


def reference_results(vectors_dir: str, implementation: str = "ppo_ref") -> dict:
    """ppo_ref's own results document for ``vectors_dir`` (the format another implementation
    writes)."""
    import ppo_ref
    cases = {case["name"]: {"outputs": encode(compute_outputs(case))}
             for case in load_cases(vectors_dir)}
    return {"format": RESULTS_FORMAT, "implementation": f"{implementation} {ppo_ref.__version__}",
            "cases": cases}


def _compare(got, expected, atol: float, rtol: float):
    """``(max_abs_err, ok, detail)`` of one output."""
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
    inf_e, nan_e = np.isinf(exp), np.isnan(exp)
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
    """Compare another implementation's results file with the vectors, case by case.

    ``vectors_dir`` is written by :func:`ppo_ref.vectors.write_vectors`, ``results_file`` a
    results document (module docstring). ``atol``/``rtol`` override every case's tolerance,
    ``profile`` (a key of :data:`TOLERANCE_PROFILES`) sets its floor, and ``tolerances``
    (``{"<case>": {"atol": .., "rtol": ..}, "<case>/<output>": {..}, "*/<output>": {..}}``)
    overrides all three, the most specific entry winning. ``skip_outputs`` (``"clip_fraction"``
    or ``"<case>/<output>"``; a results case may list its own in ``"skip"``) are not compared;
    ``allow_missing`` makes an absent case ``SKIP`` instead of ``MISSING``; ``explain`` names,
    for a FAIL, the conventions under which it would pass (:func:`alternative_conventions`).

    Returns one dict per case in index order, then an ``UNKNOWN`` row per results case the
    vectors lack: ``case``, ``kind``, ``preset``, ``status`` (``PASS``; ``FAIL``: a difference,
    an unexpected output or key, or non-numbers; ``MISSING``; ``SKIP``: absent with
    ``allow_missing``, or every output skipped), ``max_err`` (``inf`` for a shape or
    special-value mismatch, ``nan`` when nothing was compared), ``worst`` (its output),
    ``atol``, ``rtol``, ``detail``, ``alternatives``.

    Raises ``ValueError`` for a bad ``profile``, ``atol``, ``rtol`` or ``tolerances`` entry, a
    ``skip_outputs`` entry naming no output, a results file that is not a results document,
    or vectors that do not load."""
    if profile not in TOLERANCE_PROFILES:
        raise ValueError(f"profile must be one of {list(TOLERANCE_PROFILES)}, got {profile!r}")
    if tolerances is not None and not isinstance(tolerances, Mapping):
        raise ValueError(f"tolerances must map case and output names to tolerances, got "
                         f"{type(tolerances).__name__}")
    tolerances = dict(tolerances or {})
    for key, tol in tolerances.items():
        if not _is_tolerance(tol):
            raise ValueError(f"tolerances[{key!r}] must be {{'atol': number >= 0, 'rtol': "
                             f"number >= 0}}, got {tol!r}")
    for name, tol in (("atol", atol), ("rtol", rtol)):
        if tol is not None and not _is_bound(tol):
            raise ValueError(f"{name} must be a finite number >= 0, got {tol!r}")
    results = read_json_file(results_file, "results file")
    if not isinstance(results, dict):
        raise ValueError(f"results file {results_file} must hold a JSON object")
    if results.get("format") != RESULTS_FORMAT:
        raise ValueError(f"results_file format must be {RESULTS_FORMAT!r}, "
                         f"got {results.get('format')!r} in {results_file}")
    got_cases = results.get("cases", {})
    if not isinstance(got_cases, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("outputs", {}), dict)
            for v in got_cases.values()):
        raise ValueError(f"results file {results_file}: 'cases' must map case names to "
                         "{'outputs': {...}}")
    floor = TOLERANCE_PROFILES[profile] or {"atol": 0.0, "rtol": 0.0}
    cases = load_cases(vectors_dir)
    outputs = {(case["name"], key) for case in cases for key in flatten(case["expected"])}
    unknown = [item for item in skip_outputs if not any(
        item in (key, f"{name}/{key}") for name, key in outputs)]
    if unknown:
        raise ValueError(f"skip_outputs names no output of these vectors: {unknown}")
    rows = []
    for case in cases:
        name = case["name"]
        tol = case.get("tolerance", DEFAULT_TOLERANCE)
        own = tolerances.get(name, {})
        a = own.get("atol", max(tol["atol"] if atol is None else atol, floor["atol"]))
        r = own.get("rtol", max(tol["rtol"] if rtol is None else rtol, floor["rtol"]))
        row = {"case": name, "kind": case["kind"], "preset": case["preset"], "atol": a,
               "rtol": r, "max_err": math.nan, "worst": "", "detail": "", "alternatives": []}
        if name in got_cases:
            row.update(_check_case(case, got_cases[name], a, r, tolerances, skip_outputs,
                                   explain))
        else:
            row["status"] = "SKIP" if allow_missing else "MISSING"
        rows.append(row)
    known = {row["case"] for row in rows}
    rows += [{"case": str(name), "kind": "", "preset": "", "status": "UNKNOWN",
              "atol": math.nan, "rtol": math.nan, "max_err": math.nan, "worst": "",
              "detail": "not a case of these vectors"} for name in got_cases if name not in known]
    return rows


def _check_case(case, got_case, atol, rtol, tolerances, skip_outputs, explain) -> dict:
    """The ``status``, ``max_err``, ``worst``, ``detail`` and ``alternatives`` of one case."""
    name = case["name"]
    extra_keys = sorted(set(got_case) - {"outputs", "skip"})
    own_skip = got_case.get("skip", [])
    if not (isinstance(own_skip, list) and all(isinstance(x, str) for x in own_skip)):
        own_skip = []
        extra_keys.append("skip (must be a list of output names)")
    expected = flatten(case["expected"])
    skipped = sorted(k for k in expected
                     if k in own_skip or k in skip_outputs or f"{name}/{k}" in skip_outputs)
    try:
        got = flatten(decode(got_case.get("outputs", {})))
    except (ValueError, TypeError, OverflowError) as exc:
        return {"status": "FAIL", "max_err": math.inf, "detail": f"outputs not numeric: {exc}"}
    unexpected = sorted(set(got) - set(expected))
    details = []
    if unexpected or extra_keys:
        details.append("unexpected " + ", ".join(
            ([f"outputs {unexpected}"] if unexpected else [])
            + ([f"keys {extra_keys}"] if extra_keys else [])))
    ok = not details
    worst, worst_key = 0.0, ""
    compared = [k for k in expected if k not in skipped]
    for key in compared:
        if key not in got:
            ok = False
            details.append(f"missing output {key}")
            worst, worst_key = math.inf, key
            continue
        own = {**tolerances.get(f"*/{key}", {}), **tolerances.get(f"{name}/{key}", {})}
        err, good, detail = _compare(got[key], expected[key], own.get("atol", atol),
                                     own.get("rtol", rtol))
        if not good:
            ok = False
            details.append(f"{key}: {detail}" if detail else f"{key} out of tolerance")
        if err > worst or not worst_key:
            worst, worst_key = err, key
    if skipped:
        details.append("skipped outputs: " + ", ".join(skipped))
    if not compared and ok:
        return {"status": "SKIP", "detail": "every output skipped: nothing compared"}
    alternatives = []
    if not ok and explain and not unexpected and not extra_keys:
        try:
            alternatives = alternative_conventions(
                case, {k: v for k, v in got.items() if k not in skipped}, atol, rtol)
        except Exception:  # a results file that breaks the explanation still gets its row
            alternatives = []
        details.append("would pass under " + " | ".join(alternatives) if alternatives
                       else "no other known convention passes")
    return {"status": "PASS" if ok else "FAIL", "max_err": worst, "worst": worst_key,
            "detail": "; ".join(details), "alternatives": alternatives}


def nothing_compared(rows: List[dict]) -> bool:
    """True when no case passed or failed, so no output was compared."""
    return not any(r["status"] in ("PASS", "FAIL") for r in rows)


def _printable(text: str) -> str:
    """``text`` with every unprintable character (line ends, terminal escapes) as its escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def format_table(rows: List[dict]) -> str:
    """The rows of :func:`check_results` as a fixed-width text table, one line per case and a
    summary; every cell printable."""
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
    counts = {status: sum(r["status"] == status for r in rows) for status, _ in _STATUSES}
    lines.append(", ".join(f"{counts[k]} {word}" for k, word in _STATUSES
                           if counts[k] or k == "PASS"))
    return "\n".join(lines)


def alternative_conventions(case: Mapping, got: Mapping[str, Any], atol: float,
                            rtol: float) -> List[str]:
    """The conventions under which ppo_ref's outputs for ``case`` equal ``got`` (flattened,
    decoded outputs) within the tolerance, each described as ``"cleanrl/rlax
    (truncation='terminate', ...)"``.

    Tries every combination of the :data:`ppo_ref.conventions.OPTIONS` the case's kind reads
    (:data:`ppo_ref.vectors.cases.OPTION_KEYS`), plus the case's own value where the table lacks
    it (``dual_clip=1.5``); a setting the case leaves out has the option's reference value.
    Empty when none passes or the kind has no options."""
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
            presets = [p for p, fields in PRESETS.items()
                       if all(fields.get(k) == v for k, v in combo.items())]
            out.append(f"{'/'.join(presets)} ({text})" if presets else f"({text})")
    return out


def encode_decode(outputs):
    """Outputs as a results file carries them (encoded to JSON values and decoded back)."""
    return decode(encode(outputs))
