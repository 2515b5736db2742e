"""Tests of ppo_ref.envs: registration, gymnasium API conformance, velocity masking, the
MemoryCue cue/answer logic, and seeding."""
import importlib
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.utils.env_checker import check_env

import ppo_ref  # noqa: F401  (registers the ids)
from ppo_ref import envs
from ppo_ref.envs import MaskVelocityWrapper, MemoryCueEnv


# ---------------------------------------------------------------- registration and API checks

def test_ids_registered_and_reimport_is_harmless():
    assert "ppo_ref/CartPoleNoVel-v1" in gym.registry
    assert "ppo_ref/MemoryCue-v0" in gym.registry
    importlib.reload(envs)  # registering again must not raise
    assert gym.spec("ppo_ref/CartPoleNoVel-v1").max_episode_steps == 500


@pytest.mark.parametrize("blank_steps", [0, 1, 8])
def test_memory_cue_passes_gymnasium_check_env(blank_steps):
    check_env(MemoryCueEnv(blank_steps=blank_steps), skip_render_check=True)


def test_cartpole_no_vel_passes_gymnasium_check_env():
    with warnings.catch_warnings():
        # check_env warns that a wrapper is being checked; the wrapper is the thing under test.
        warnings.simplefilter("ignore")
        check_env(MaskVelocityWrapper(CartPoleEnv()), skip_render_check=True)


# ---------------------------------------------------------------- CartPoleNoVel

def test_cartpole_no_vel_masks_velocities_and_keeps_everything_else():
    masked = gym.make("ppo_ref/CartPoleNoVel-v1")
    full = gym.make("CartPole-v1")
    assert masked.observation_space == full.observation_space
    assert masked.action_space == full.action_space
    actions = np.random.default_rng(3).integers(2, size=600)
    o_m, _ = masked.reset(seed=11)
    o_f, _ = full.reset(seed=11)
    saw_nonzero_velocity = False
    for a in actions:
        assert o_m.shape == (4,) and o_m.dtype == o_f.dtype
        np.testing.assert_array_equal(o_m[[0, 2]], o_f[[0, 2]])
        np.testing.assert_array_equal(o_m[[1, 3]], 0.0)
        saw_nonzero_velocity |= bool(np.any(o_f[[1, 3]] != 0))
        assert masked.observation_space.contains(o_m)
        o_m, r_m, term_m, trunc_m, _ = masked.step(int(a))
        o_f, r_f, term_f, trunc_f, _ = full.step(int(a))
        assert (r_m, term_m, trunc_m) == (r_f, term_f, trunc_f)
        if term_m or trunc_m:
            o_m, _ = masked.reset()
            o_f, _ = full.reset()
    assert saw_nonzero_velocity  # the test would be vacuous otherwise


def test_cartpole_no_vel_time_limit_is_500():
    env = gym.make("ppo_ref/CartPoleNoVel-v1")
    env.reset(seed=0)
    # Balance by hand with the *true* state (read from the unwrapped env) to reach the limit.
    for t in range(500):
        x, x_dot, theta, theta_dot = env.unwrapped.state
        push_right = theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0
        _, _, terminated, truncated, _ = env.step(int(push_right))
        if terminated or truncated:
            break
    assert (t, terminated, truncated) == (499, False, True)


def test_mask_velocity_wrapper_rejects_bad_arguments():
    with pytest.raises(ValueError, match="velocity_indices"):
        MaskVelocityWrapper(CartPoleEnv(), velocity_indices=(1, 4))
    with pytest.raises(ValueError, match="observation_space"):
        MaskVelocityWrapper(gym.make("FrozenLake-v1"))  # Discrete observations


# ---------------------------------------------------------------- MemoryCue

def _play(env, actions, seed):
    """Run one episode; return (observations, rewards, terminated flags, infos)."""
    obs, info = env.reset(seed=seed)
    observations, rewards, terms, infos = [obs], [], [], [info]
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        assert trunc is False
        rewards.append(r)
        terms.append(term)
        infos.append(info)
        if term:
            break
        observations.append(obs)
    return np.array(observations), np.array(rewards), np.array(terms), infos


@pytest.mark.parametrize("k", [0, 1, 3, 8])
def test_memory_cue_episode_layout(k):
    env = MemoryCueEnv(blank_steps=k)
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        cue = obs[0]
        assert cue in (-1.0, 1.0)
        right = 1 if cue > 0 else 0
        obs_seq, rewards, terms, infos = _play(env, [0] * (k + 1) + [right], seed)
        assert len(rewards) == k + 2 and obs_seq.shape == (k + 2, 2)
        assert obs_seq.dtype == np.float32
        # cue only on the first observation, flag only on the last (the answer step)
        np.testing.assert_array_equal(obs_seq[:, 0], [cue] + [0.0] * (k + 1))
        np.testing.assert_array_equal(obs_seq[:, 1], [0.0] * (k + 1) + [1.0])
        np.testing.assert_array_equal(rewards, [0.0] * (k + 1) + [1.0])
        np.testing.assert_array_equal(terms, [False] * (k + 1) + [True])
        assert infos[-1]["correct"] is True and infos[-1]["cue"] == cue


def test_memory_cue_wrong_answer_and_ignored_blank_actions():
    env = MemoryCueEnv(blank_steps=5)
    rng = np.random.default_rng(0)
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        wrong = 0 if obs[0] > 0 else 1
        blanks_a = list(rng.integers(2, size=6))
        blanks_b = list(1 - np.array(blanks_a))
        obs_a, rew_a, _, inf_a = _play(env, blanks_a + [wrong], seed)
        obs_b, rew_b, _, _ = _play(env, blanks_b + [wrong], seed)
        np.testing.assert_array_equal(obs_a, obs_b)   # blank-step actions change nothing
        np.testing.assert_array_equal(rew_a, rew_b)
        assert rew_a[-1] == -1.0 and inf_a[-1]["correct"] is False


def test_memory_cue_answer_step_observation_carries_no_cue_information():
    env = MemoryCueEnv(blank_steps=8)
    seen = {}
    for seed in range(40):
        obs_seq, _, _, infos = _play(env, [0] * 10, seed)
        seen.setdefault(infos[0]["cue"], set()).add(tuple(obs_seq[1:].ravel()))
    # both cues occur, and after step 0 the observation sequences are identical for both
    assert set(seen) == {-1.0, 1.0}
    assert seen[-1.0] == seen[1.0] and len(seen[1.0]) == 1


def test_memory_cue_seeding_is_reproducible_and_cues_are_balanced():
    def cues(seed, n):
        env = gym.make("ppo_ref/MemoryCue-v0")
        out = [env.reset(seed=seed)[1]["cue"]]
        out += [env.reset()[1]["cue"] for _ in range(n - 1)]
        return np.array(out)

    a, b, c = cues(7, 400), cues(7, 400), cues(8, 400)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert abs(np.mean(a > 0) - 0.5) < 0.1  # 400 fair coin flips: 5 standard deviations


def test_memory_cue_in_same_step_autoreset_vector_env():
    venv = gym.make_vec("ppo_ref/MemoryCue-v0", num_envs=3, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                        blank_steps=2)
    obs, _ = venv.reset(seed=[1, 2, 3])
    assert obs.shape == (3, 2)
    ends = []
    for t in range(8):
        obs, rew, term, trunc, _ = venv.step(np.ones(3, dtype=np.int64))
        ends.append(term.copy())
    # episodes last k + 2 = 4 steps: terminal on steps 3 and 7, new cue shown right after
    np.testing.assert_array_equal(np.array(ends)[:, 0], [False, False, False, True] * 2)
    assert np.all(np.abs(obs[:, 0]) == 1.0) and np.all(obs[:, 1] == 0.0)
    venv.close()


def test_memory_cue_errors():
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="blank_steps"):
            MemoryCueEnv(blank_steps=bad)
    with pytest.raises(ValueError, match="render_mode"):
        MemoryCueEnv(render_mode="human")
    env = MemoryCueEnv()
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(2)
