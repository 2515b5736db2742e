"""episode_starts and the transition masks: oracle, definition, goldens and validation."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oracles import episode_starts_oracle
from ppo_ref.spec.masks import episode_starts, transition_masks


@st.composite
def flag_patterns(draw):
    T = draw(st.integers(0, 40))
    shape = (T,) if draw(st.booleans()) else (T, draw(st.integers(1, 6)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    p_term = draw(st.sampled_from([0.0, 0.1, 0.4, 1.0]))
    p_trunc = draw(st.sampled_from([0.0, 0.1, 0.4]))
    terminated = rng.random(shape) < p_term
    truncated = rng.random(shape) < p_trunc
    initial = rng.random(shape[1:]) < 0.5
    encode = draw(st.sampled_from(["bool", "int", "float"]))
    if encode == "int":
        terminated, truncated = terminated.astype(np.int64), truncated.astype(np.int8)
    elif encode == "float":
        terminated, truncated = terminated.astype(np.float64), truncated.astype(np.float32)
    if len(shape) == 1:
        initial = bool(initial)
    return terminated, truncated, initial


@given(flag_patterns())
def test_episode_starts_equals_oracle_and_definition(case):
    terminated, truncated, initial = case
    got = episode_starts(terminated, truncated, initial)
    assert got.dtype == np.bool_ and got.shape == np.shape(terminated)
    np.testing.assert_array_equal(got, episode_starts_oracle(terminated, truncated, initial))
    done = np.asarray(terminated).astype(bool) | np.asarray(truncated).astype(bool)
    if len(got):
        np.testing.assert_array_equal(got[0], initial)            # the carry at t = 0
        np.testing.assert_array_equal(got[1:], done[:-1])         # done[t-1]


def test_episode_starts_golden():
    # env 0: terminates at t=1 -> row 2 starts an episode; carry True at t=0.
    # env 1: truncates at t=0 and both flags at t=2 -> rows 1 and 3 start episodes.
    terminated = [[0, 0], [1, 0], [0, 1], [0, 0]]
    truncated = [[0, 1], [0, 0], [0, 1], [1, 0]]  # the last row's flags affect the NEXT rollout
    got = episode_starts(terminated, truncated, [True, False])
    np.testing.assert_array_equal(got, [[True, False], [False, True], [True, False], [False, True]])
    # a scalar carry applies to every env (e.g. True at the very first reset)
    np.testing.assert_array_equal(episode_starts(np.zeros((2, 3)), np.zeros((2, 3)), True),
                                  [[True] * 3, [False] * 3])
    assert episode_starts(np.zeros(0, bool), np.zeros(0, bool), True).shape == (0,)
    assert episode_starts(np.zeros((0, 3)), np.zeros((0, 3)), np.ones(3)).shape == (0, 3)


@pytest.mark.parametrize("kwargs, name", [
    (dict(terminated=[0, 2], truncated=[0, 0], initial=False), "terminated"),
    (dict(terminated=[0, 1], truncated=[0.5, 0], initial=False), "truncated"),
    (dict(terminated=[0, 1], truncated=[0, 0], initial=3), "initial"),
    (dict(terminated=[0, 1], truncated=[0, 0, 0], initial=False), "truncated"),
    (dict(terminated=[[0, 1]], truncated=[[0, 0]], initial=[1, 0, 1]), "initial"),
    (dict(terminated=np.zeros((2, 2, 2)), truncated=np.zeros((2, 2, 2)), initial=np.zeros((2, 2))),
     "terminated"),
    (dict(terminated=["a", "b"], truncated=[0, 0], initial=False), "terminated"),
    (dict(terminated=[0, np.nan], truncated=[0, 0], initial=False), "terminated"),
])
def test_episode_starts_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        episode_starts(**kwargs)


def test_transition_masks_rule():
    # Columns: neither, terminated only, truncated only, both.
    term = np.array([False, True, False, True])
    trunc = np.array([False, False, True, True])
    m = transition_masks(term, trunc, "bootstrap")  # docs/specification.md §2: termination wins
    np.testing.assert_array_equal(m.terminal, [0, 1, 0, 1])
    np.testing.assert_array_equal(m.bootstrap_final, [0, 0, 1, 0])
    np.testing.assert_array_equal(m.done, [0, 1, 1, 1])
    m = transition_masks(term, trunc, "terminate")  # CleanRL
    np.testing.assert_array_equal(m.terminal, [0, 1, 1, 1])
    np.testing.assert_array_equal(m.bootstrap_final, [0, 0, 0, 0])
    np.testing.assert_array_equal(m.done, [0, 1, 1, 1])
    m = transition_masks(term, trunc, "ignore")  # thrust-rl
    np.testing.assert_array_equal(m.terminal, [0, 1, 0, 1])
    np.testing.assert_array_equal(m.bootstrap_final, [0, 0, 0, 0])
    np.testing.assert_array_equal(m.done, [0, 1, 0, 1])
    with pytest.raises(ValueError, match="^truncation"):
        transition_masks(term, trunc, "cut")
