"""Golden cases for gae and vtrace with numbers derived by hand (derivations beside them).

All numbers are chosen so that every intermediate is exact in binary floating point; the
expected values are exact, the comparison tolerance only covers exp/log round trips.
"""
import numpy as np
import pytest

from ppo_ref.spec.advantages import gae, vtrace

# ---------------------------------------------------------------------------------------------
# GAE, one env, T = 4, gamma = 0.5, gae_lambda = 0.5 (so gamma * lambda = 0.25)
#
#   t           0     1          2     3
#   rewards     1     2          3     4
#   values      1     2          2     4
#   terminated  .     .          .     T
#   truncated   .     T          .     .
#   final_values[1] = 6 (V of the real last observation of the cut episode), last_values = 10
#
# reference (docs/specification.md §2: "bootstrap", terminal last row not bootstrapped), backward:
#   t=3 terminated:      delta3 = 4 + 0            - 4 = 0    A3 = 0                  R3 = 4
#   t=2 next = V[3] = 4: delta2 = 3 + 0.5*4        - 2 = 3    A2 = 3 + 0.25*A3 = 3    R2 = 5
#   t=1 truncated -> final_values[1] = 6, trace cut:
#                        delta1 = 2 + 0.5*6        - 2 = 3    A1 = 3                  R1 = 5
#   t=0 next = V[1] = 2: delta0 = 1 + 0.5*2        - 1 = 1    A0 = 1 + 0.25*3 = 1.75  R0 = 2.75
# bootstrap_terminal_last_row=True (thrust-rl): t=3 bootstraps last_values = 10:
#   delta3 = 4 + 0.5*10 - 4 = 5, A3 = 5; A2 = 3 + 0.25*5 = 4.25; A1, A0 unchanged.
# truncation="terminate" (CleanRL): t=1 has no bootstrap: delta1 = 2 - 2 = 0, A1 = 0;
#   A0 = 1 + 0.25*0 = 1.
# truncation="ignore" (thrust-rl): t=1 bootstraps V[2] = 2 and the trace runs on:
#   delta1 = 2 + 0.5*2 - 2 = 1, A1 = 1 + 0.25*A2 = 1.75; A0 = 1 + 0.25*1.75 = 1.4375.
# ---------------------------------------------------------------------------------------------
GAE_CASE = dict(rewards=[1.0, 2.0, 3.0, 4.0], values=[1.0, 2.0, 2.0, 4.0],
                terminated=[False, False, False, True], truncated=[False, True, False, False],
                last_values=10.0, final_values=[0.0, 6.0, 0.0, 0.0])


@pytest.mark.parametrize("options, advantages", [
    ({}, [1.75, 3.0, 3.0, 0.0]),
    ({"bootstrap_terminal_last_row": True}, [1.75, 3.0, 4.25, 5.0]),
    ({"truncation": "terminate"}, [1.0, 0.0, 3.0, 0.0]),
    ({"truncation": "ignore"}, [1.4375, 1.75, 3.0, 0.0]),
])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gae_golden(options, advantages, dtype):
    case = {k: (np.asarray(v, dtype) if k not in ("terminated", "truncated", "last_values") else v)
            for k, v in GAE_CASE.items()}
    adv, ret = gae(**case, gamma=0.5, gae_lambda=0.5, **options)
    assert adv.dtype == dtype
    np.testing.assert_array_equal(adv, advantages)
    np.testing.assert_array_equal(ret, np.add(advantages, GAE_CASE["values"]))


# Both flags on one step: termination wins, final_values is not read.
#   T = 2, gamma = 0.5, lambda = 1, rewards [1, 1], values [0, 0], last_values 4,
#   step 0 terminated and truncated, final_values[0] = 100 (must be ignored):
#   A1 = 1 + 0.5*4 - 0 = 3;  A0 = 1 + 0 - 0 = 1 (no bootstrap, trace cut).
def test_gae_golden_both_flags_termination_wins():
    adv, _ = gae([1.0, 1.0], [0.0, 0.0], [True, False], [True, False], 4.0, [100.0, 0.0],
                 gamma=0.5, gae_lambda=1.0)
    np.testing.assert_array_equal(adv, [1.0, 3.0])


# Two envs side by side (columns), gamma = 1, lambda = 1 (Monte-Carlo with bootstrap):
#   env 0: rewards [1, 1, 1], values 0, no flags, last_values 2 -> A = [5, 4, 3]
#   env 1: rewards [1, 1, 1], values 0, terminated at t=0, last_values 2
#          t=2: 1 + 2 = 3; t=1: 1 + A2 = 4; t=0: terminal: 1 -> A = [1, 4, 3]
def test_gae_golden_two_envs():
    adv, _ = gae(np.ones((3, 2)), np.zeros((3, 2)), [[0, 1], [0, 0], [0, 0]], np.zeros((3, 2)),
                 [2.0, 2.0], gamma=1.0, gae_lambda=1.0)
    np.testing.assert_array_equal(adv, [[5.0, 1.0], [4.0, 4.0], [3.0, 3.0]])


# ---------------------------------------------------------------------------------------------
# V-trace, one env, T = 3, gamma = 0.5, rho_bar = c_bar = 1 (pg_rho_bar = rho_bar)
#
#   t               0     1     2
#   rewards         1     2     3
#   values          1     2     3
#   pi/mu ratio     2     0.5   1      -> rho = min(1, ratio) = [1, 0.5, 1]
#   truncated       .     T     .         final_values[1] = 4, last_values = 2
#
# lambda_ = 1 (IMPALA): c = min(1, ratio) = [1, 0.5, 1]
#   t=2 last row, next = last_values = 2:
#       vs2 = 3 + 1*(3 + 0.5*2 - 3) = 4;         q2 = 3 + 0.5*2 = 4;    pg2 = 1*(4 - 3) = 1
#   t=1 truncated, next = final_values[1] = 4, trace cut:
#       vs1 = 2 + 0.5*(2 + 0.5*4 - 2) = 3;       q1 = 2 + 0.5*4 = 4;    pg1 = 0.5*(4 - 2) = 1
#   t=0 next = V[1] = 2:
#       vs0 = 1 + 1*(1 + 0.5*2 - 1) + 0.5*c0*(vs1 - V1) = 2 + 0.5*1*1 = 2.5
#       q0 = 1 + 0.5*(1*vs1 + 0*V1) = 2.5;       pg0 = min(1, 2)*(2.5 - 1) = 1.5
# lambda_ = 0.5 (rlax): c = 0.5*min(1, ratio) = [0.5, 0.25, 0.5]; only t=0 reads c or lambda:
#       vs0 = 2 + 0.5*0.5*1 = 2.25;  q0 = 1 + 0.5*(0.5*3 + 0.5*2) = 2.25;  pg0 = 1.25
# pg_rho_bar = 2 with lambda_ = 1: pg0 = min(2, 2)*1.5 = 3; pg1 = 0.5*2 = 1; pg2 = 1.
# ---------------------------------------------------------------------------------------------
VTRACE_CASE = dict(behaviour_log_probs=np.log([0.25, 0.5, 0.5]),
                   target_log_probs=np.log([0.5, 0.25, 0.5]),
                   rewards=[1.0, 2.0, 3.0], values=[1.0, 2.0, 3.0],
                   terminated=[0, 0, 0], truncated=[0, 1, 0], last_values=2.0,
                   final_values=[0.0, 4.0, 0.0])


@pytest.mark.parametrize("options, vs, pg", [
    ({}, [2.5, 3.0, 4.0], [1.5, 1.0, 1.0]),
    ({"lambda_": 0.5}, [2.25, 3.0, 4.0], [1.25, 1.0, 1.0]),
    ({"pg_rho_bar": 2.0}, [2.5, 3.0, 4.0], [3.0, 1.0, 1.0]),
])
def test_vtrace_golden(options, vs, pg):
    got = vtrace(**VTRACE_CASE, gamma=0.5, **options)
    np.testing.assert_allclose(got.vs, vs, rtol=1e-14)
    np.testing.assert_allclose(got.pg_advantages, pg, rtol=1e-14)


# V-trace with a termination on the last row, T = 2, gamma = 0.5, on-policy, lambda_ = 1:
#   rewards [1, 1], values [1, 1], last_values 10, terminated at t=1.
#   reference: t=1: vs1 = 1 + (1 + 0 - 1) = 1, pg1 = 0;  t=0: vs0 = 1 + (1 + 0.5*1 - 1) + 0.5*(1-1)
#         = 1.5, q0 = 1 + 0.5*vs1 = 1.5, pg0 = 0.5.
#   bootstrap_terminal_last_row: t=1: vs1 = 1 + 0.5*10 = 6, pg1 = 5;
#         t=0: vs0 = 1.5 + 0.5*(6 - 1) = 4, q0 = 1 + 0.5*6 = 4, pg0 = 3.
@pytest.mark.parametrize("flag, vs, pg", [(False, [1.5, 1.0], [0.5, 0.0]),
                                          (True, [4.0, 6.0], [3.0, 5.0])])
def test_vtrace_golden_terminal_last_row(flag, vs, pg):
    got = vtrace([0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [0, 1], [0, 0], 10.0,
                 gamma=0.5, bootstrap_terminal_last_row=flag)
    np.testing.assert_array_equal(got.vs, vs)
    np.testing.assert_array_equal(got.pg_advantages, pg)
    assert isinstance(got, tuple) and got._fields == ("vs", "pg_advantages")
