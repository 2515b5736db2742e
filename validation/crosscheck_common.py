"""Shared by the ``crosscheck_<library>.py`` scripts: run a list of ppo_ref.testing checks and
print one table row per check.

Each script imports its library (or skips with a message when it is not installed), writes a
small adapter around the library's own function, and hands ``run_table`` rows of
``(name, thunk)``: the thunk runs one ``ppo_ref.testing`` check or ``identify`` and returns a
one-line verdict (a :class:`ppo_ref.testing.Mismatch` is caught and shown with its minimal
input). A script exits 0 when every row ran (PASS, FAIL and a named convention are all results:
the table is the product), 0 with a SKIP line when the library is missing.
"""
from __future__ import annotations

import importlib
import sys
import textwrap
import warnings

warnings.filterwarnings("ignore")  # the libraries' own warnings (degrees of freedom, ...) are noise here


def require(module: str, library: str):
    """``importlib.import_module(module)``, or print a SKIP line and exit 0."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or a library whose own imports fail
        print(f"SKIP {library}: cannot import {module} ({type(exc).__name__}: {exc}); install it "
              f"in a separate venv to run this cross-check")
        raise SystemExit(0)


def verdict_of(thunk) -> str:
    from ppo_ref.testing import Mismatch
    try:
        out = thunk()
    except Mismatch as m:
        return "FAIL\n" + str(m)
    if out is None:
        return "PASS"
    return str(out)


def run_table(title: str, rows) -> int:
    print(f"== {title}")
    width = max(len(name) for name, _ in rows)
    for name, thunk in rows:
        text = verdict_of(thunk)
        first, *rest = text.splitlines()
        print(f"{name:<{width}}  {first}")
        for line in rest:
            print(textwrap.indent(line, " " * (width + 4)))
    sys.stdout.flush()
    return 0
