"""pytest wrapper of parity_lstm_sb3contrib.py; skipped without torch / sb3_contrib."""
import pytest

pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

import parity_lstm_sb3contrib  # noqa: E402


def test_recurrent_policy_matches_sb3_contrib():
    rows = parity_lstm_sb3contrib.run()
    failed = [r for r in rows if not r.passed]
    assert not failed, failed
    assert sum(r.quantity == "all parameter gradients" for r in rows) == 2


def test_resets_matter_in_the_comparison():
    """Without the episode starts the outputs change: the sequence really exercises resets."""
    import numpy as np
    from ppo_ref.config import PPOConfig
    from ppo_ref.spec.recurrent_networks import LSTMStates
    from ppo_ref.tiers import tier_for
    from ppo_ref.train.policies import RecurrentPolicy
    p = parity_lstm_sb3contrib
    rng = np.random.default_rng(0)
    obs, actions, starts, h0, c0, _ = p.sequence_data(rng)
    pol = RecurrentPolicy(p.OBS_SPACE, p.ACT_SPACE,
                          PPOConfig(net_arch=(64,), lstm_hidden_size=p.HIDDEN), tier_for("fast"))
    params = pol.init_params(np.random.default_rng(1))
    a = pol.evaluate(params, (obs, actions, LSTMStates(h0, c0), starts))[2]
    b = pol.evaluate(params, (obs, actions, LSTMStates(h0, c0), np.zeros_like(starts)))[2]
    assert np.max(np.abs(a - b)) > 1e-6
