"""pytest wrapper of parity_vtrace.py (rlax vectors, IMPALA double sum); no optional dependency."""
import parity_vtrace


def test_vtrace_parity_rlax_and_double_sum():
    rows = parity_vtrace.run()
    failed = [r for r in rows if not r.passed]
    assert not failed, failed
    assert len(rows) == 7


def test_double_sum_oracle_detects_a_wrong_trace():
    """The ground truth is not vacuous: ppo_ref with c_bar changed disagrees with it."""
    import numpy as np
    import ppo_ref
    rng = np.random.default_rng(3)
    x = parity_vtrace.random_rollout(rng, 8, 2)
    x["terminated"][:] = False
    x["truncated"][:] = False
    settings = dict(gamma=0.9, rho_bar=1.0, c_bar=0.5, pg_rho_bar=1.0, lambda_=1.0)
    vs, _ = parity_vtrace.spec_double_sum(**x, **settings)
    wrong = ppo_ref.vtrace(**x, **dict(settings, c_bar=0.25))
    assert np.max(np.abs(wrong.vs - vs)) > 1e-3
