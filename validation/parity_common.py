"""Small helpers shared by the parity scripts: one comparison row type and the table printer.

Every parity script builds a list of :class:`Row` (one per compared quantity), prints it with
:func:`print_table` from its ``main()`` and returns it, so the pytest wrapper can assert
``all(row.passed for row in rows)``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@dataclass
class Row:
    """One comparison: ``max_err`` is the largest absolute difference over the compared arrays
    (``nan`` when a comparison is qualitative); ``passed`` says whether it is within ``tol``
    (or, for an *expected* difference, that the difference is really there)."""

    case: str
    quantity: str
    max_err: float
    tol: float
    passed: bool
    note: str = ""


def max_abs_diff(a, b) -> float:
    """Largest ``|a - b|`` over broadcast arrays (0.0 for empty arrays)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {a.shape} vs {b.shape}")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def compare(case: str, quantity: str, got, expected, tol: float, note: str = "") -> Row:
    """Row for ``max|got - expected| <= tol``."""
    err = max_abs_diff(got, expected)
    return Row(case, quantity, err, tol, bool(err <= tol), note)


def expect_difference(case: str, quantity: str, got, other, min_diff: float, note: str) -> Row:
    """Row that passes when the two results *do* differ by more than ``min_diff`` (a documented
    convention difference that must stay visible)."""
    err = max_abs_diff(got, other)
    return Row(case, quantity, err, min_diff, bool(err > min_diff), "differs: " + note)


def load_json(name: str) -> dict:
    """Load ``validation/data/<name>``."""
    with open(os.path.join(DATA_DIR, name), encoding="utf-8") as fh:
        return json.load(fh)


def print_table(title: str, rows) -> bool:
    """Print a fixed-width table of ``rows``; return True when every row passed."""
    print(f"\n== {title} ==")
    w_case = max([len(r.case) for r in rows] + [4])
    w_q = max([len(r.quantity) for r in rows] + [8])
    print(f"{'case':<{w_case}}  {'quantity':<{w_q}}  {'max |err|':>10}  {'tol':>8}  result  note")
    for r in rows:
        status = "PASS" if r.passed else "FAIL"
        print(f"{r.case:<{w_case}}  {r.quantity:<{w_q}}  {r.max_err:>10.3e}  {r.tol:>8.1e}  "
              f"{status:<6}  {r.note}")
    ok = all(r.passed for r in rows)
    print(f"-> {'all passed' if ok else 'FAILURES'} ({sum(r.passed for r in rows)}/{len(rows)})")
    return ok
