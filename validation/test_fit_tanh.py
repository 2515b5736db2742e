"""The compiled tanh's constants are the ones validation/fit_tanh.py derives, and its
polynomials keep the error bounds stated beside them (skipped without mpmath, which the
``validation`` extra installs)."""
import pytest

pytest.importorskip("mpmath")

import fit_tanh  # noqa: E402


def test_module_constants_are_the_derived_ones_within_their_stated_bounds(capsys):
    assert fit_tanh.main() == 0, capsys.readouterr().out
