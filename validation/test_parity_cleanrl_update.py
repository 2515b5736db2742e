"""pytest wrapper of parity_cleanrl_update.py; skipped without torch."""
import pytest

pytest.importorskip("torch")

import parity_cleanrl_update  # noqa: E402


def test_full_update_matches_cleanrl_style_torch():
    rows = parity_cleanrl_update.run()
    failed = [r for r in rows if not r.passed]
    assert not failed, failed
    steps = [r for r in rows if r.quantity == "gradient steps"]
    assert "2 epochs" in steps[1].note   # the after-epoch KL rule really stopped early
