"""pytest wrapper of parity_gae_sb3.py; skipped without torch / stable_baselines3."""
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

import parity_gae_sb3  # noqa: E402


def test_gae_matches_sb3_rollout_buffer():
    rows = parity_gae_sb3.run(n_cases=30)
    failed = [r for r in rows if not r.passed]
    assert not failed, failed


def test_episode_starts_mapping_matters():
    """Feeding SB3 the flags one step off (done[t] instead of done[t-1]) must break parity: the
    comparison is sensitive to the convention it claims to map."""
    import ppo_ref
    rng = np.random.default_rng(7)
    x = parity_gae_sb3.random_rollout(rng, 12, 3)
    x["terminated"][3, :] = True
    x["terminated"][-1, :] = False
    x["truncated"][-1, :] = False
    wrong = dict(x)
    # shift: pretend episode_starts[t] = done[t] by moving every flag one row earlier
    wrong["terminated"] = np.vstack([x["terminated"][1:], np.zeros((1, 3), bool)])
    wrong["truncated"] = np.vstack([x["truncated"][1:], np.zeros((1, 3), bool)])
    wrong["final_values"] = np.vstack([x["final_values"][1:], np.zeros((1, 3))])
    a_sb3, _ = parity_gae_sb3.sb3_gae(wrong, 0.99, 0.95, float64=True)
    args = {k: x[k] for k in ("rewards", "values", "terminated", "truncated", "last_values",
                              "final_values")}
    adv, _ = ppo_ref.gae(**args, gamma=0.99, gae_lambda=0.95)
    assert np.max(np.abs(adv - a_sb3)) > 1e-3
