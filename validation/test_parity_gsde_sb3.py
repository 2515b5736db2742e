"""pytest wrapper of parity_gsde_sb3.py; skipped without torch / stable_baselines3."""
import pytest

pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

import parity_gsde_sb3  # noqa: E402


def test_gsde_matches_sb3_state_dependent_noise_distribution():
    rows = parity_gsde_sb3.run()
    failed = [r for r in rows if not r.passed]
    assert not failed, failed
    assert len(rows) == 8 * 2 * 7   # 8 settings, 2 tiers, 7 quantities each
