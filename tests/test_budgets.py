"""The package's size budgets (issue 22), kept: ``validation/budgets.py`` prints them (and the
first run's compile time, a measurement it prints beside the CPU model, not a test)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("budgets", ROOT / "validation" / "budgets.py")
budgets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(budgets)


def test_line_budgets():
    for rel, budget in budgets.LINE_BUDGETS.items():
        n = budgets.lines(ROOT / rel)
        assert n <= budget, f"{rel}: {n} lines, budget {budget}"


def test_lines_counts_what_wc_counts(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n\n# c\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text('"""d"""\n')
    (tmp_path / "sub" / "c.txt").write_text("not python\n")
    assert budgets.lines(tmp_path) == 4
