"""pytest wrapper of parity_sb3_update.py; skipped without torch / stable_baselines3."""
import pytest

pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

import parity_sb3_update  # noqa: E402


def test_full_update_matches_sb3_train():
    rows = parity_sb3_update.run()
    failed = [r for r in rows if not r.passed]
    assert not failed, failed
    params_rows = [r for r in rows if r.quantity == "all parameters"]
    assert len(params_rows) == 3 and all(r.max_err <= 1e-6 for r in params_rows)
