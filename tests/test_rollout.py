"""Rollout collection: layout, episode_starts carry, truncation bootstrap, env errors, spaces."""
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from ppo_ref.config import PPOConfig
from ppo_ref.io.state import restore_single_env_state, single_env_state
from ppo_ref.spec.normalization import (OBS_NORM_EPS, initial_moments, normalize_observations,
                                        update_moments)
from ppo_ref.tiers import tier_for
from ppo_ref.train.policies import MLPPolicy
from ppo_ref.train.ppo import PPOTrainer
from ppo_ref.train.rollout import EnvStepError, RolloutCollector, make_vector_env
from test_rollout_helpers import (ActionRecorder, CounterEnv, register_faulty,
                                  same_step_vector_env)


def _counter_collector(n_envs=2, n_steps=7, limit=3, terminate=False, backend="fast"):
    env = same_step_vector_env([lambda: CounterEnv(limit, terminate) for _ in range(n_envs)])
    cfg = PPOConfig(n_envs=n_envs, n_steps=n_steps, batch_size=n_steps * n_envs,
                    backend=backend)
    policy = MLPPolicy(env.single_observation_space, env.single_action_space, cfg,
                       tier_for(backend))
    params = policy.init_params(np.random.default_rng(0))
    # a value head that reads the counter, so V(final_obs) differs from V(reset obs)
    params["vf.w2"] += 1.0
    col = RolloutCollector(env, policy, n_steps)
    col.reset(list(range(n_envs)))
    return col, policy, params


def test_layout_and_dtypes():
    col, policy, params = _counter_collector()
    r = col.collect(params, np.random.default_rng(1))
    T, N = 7, 2
    assert r.observations.shape == (T, N, 2) and r.observations.dtype == np.float64
    assert r.actions.shape == (T, N) and r.actions.dtype == np.int64
    for name in ("rewards", "values", "log_probs"):
        assert getattr(r, name).shape == (T, N) and getattr(r, name).dtype == np.float64
    for name in ("terminated", "truncated", "episode_starts"):
        assert getattr(r, name).dtype == np.bool_
    assert r.last_values.shape == (N,)
    # the values of the rows are V(obs) under the acting parameters (compiled tier: the same bits
    # whatever rows share the call)
    np.testing.assert_array_equal(
        r.values, policy.values(params, r.observations.reshape(T * N, 2), None, None).reshape(T, N))
    np.testing.assert_array_equal(r.last_values, policy.values(params, col.obs, None, None))
    assert r.initial_state is None


def test_no_phantom_rows_and_episode_starts_carry():
    col, policy, params = _counter_collector(n_steps=7, limit=3)
    rng = np.random.default_rng(1)
    r1 = col.collect(params, rng)
    r2 = col.collect(params, rng)
    obs = np.concatenate([r1.observations, r2.observations])[:, :, 0]
    # every row is a real decision: counter 0,1,2,0,1,2,... and reward 1 (no reset-only rows)
    np.testing.assert_array_equal(obs[:, 0], np.arange(14) % 3)
    assert np.all(r1.rewards == 1.0) and np.all(r2.rewards == 1.0)
    starts = np.concatenate([r1.episode_starts, r2.episode_starts])
    done = np.concatenate([r1.truncated | r1.terminated, r2.truncated | r2.terminated])
    assert starts[0].all()
    np.testing.assert_array_equal(starts[1:], done[:-1])  # includes the carry across rollouts
    assert r2.episode_starts[0, 0] == (r1.truncated[-1, 0] or r1.terminated[-1, 0])
    assert r1.episode_lengths == [3, 3, 3, 3] and r1.episode_returns == [3.0] * 4


@pytest.mark.parametrize("backend", ["fast", "spec"])
def test_truncation_bootstraps_value_of_final_obs(backend):
    col, policy, params = _counter_collector(n_steps=7, limit=3, backend=backend)
    r = col.collect(params, np.random.default_rng(1))
    assert r.final_values is not None
    v_final = policy.values(params, np.array([[3.0, 1.0]]), None, None)[0]
    v_reset = policy.values(params, np.array([[0.0, 1.0]]), None, None)[0]
    assert v_final != v_reset
    for t, n in zip(*np.nonzero(r.truncated)):
        if backend == "fast":  # per-row arithmetic: the same bits for one row or several
            assert r.final_values[t, n] == v_final
        else:  # (BLAS rounding differs with the batch size)
            assert r.final_values[t, n] == pytest.approx(v_final, rel=1e-12, abs=1e-12)
    assert np.all(r.final_values[~r.truncated] == 0.0)
    # terminated steps need no final value
    col_t, _, params_t = _counter_collector(n_steps=7, limit=3, terminate=True)
    rt = col_t.collect(params_t, np.random.default_rng(1))
    assert rt.terminated.any() and rt.final_values is None


def test_next_step_autoreset_env_is_rejected():
    env = SyncVectorEnv([lambda: CounterEnv() for _ in range(2)],
                        autoreset_mode=AutoresetMode.NEXT_STEP)
    with pytest.raises(ValueError, match="SAME_STEP"):
        PPOTrainer(env, PPOConfig(n_envs=2, n_steps=4, batch_size=8))


def test_unsupported_spaces_raise():
    with pytest.raises(ValueError, match="observation_space must be a gymnasium Box"):
        PPOTrainer("FrozenLake-v1", PPOConfig(n_envs=1, n_steps=4, batch_size=4))
    cfg = PPOConfig(n_envs=1, n_steps=4, batch_size=4)
    with pytest.raises(ValueError, match="action_space"):
        MLPPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.MultiBinary(3), cfg, tier_for("fast"))


@pytest.mark.parametrize("fault, pattern", [("nan", "non-finite observation"),
                                            ("reward", "non-finite reward"),
                                            ("shape", "shape")])
def test_env_fault_names_env_index_and_step(fault, pattern):
    env_id = register_faulty()
    cfg = PPOConfig.zoo_cartpole(n_envs=4, batch_size=128)
    probe = PPOTrainer(env_id, cfg, seed=0, env_kwargs={"fault": fault})
    seeds = probe.env_seeds
    probe.close()
    trainer = PPOTrainer(env_id, cfg, seed=0,
                         env_kwargs={"fault": fault, "at": 40, "bad_seed": seeds[2]})
    with pytest.raises(EnvStepError, match=pattern) as info:
        trainer.learn(10_000)
    err = info.value
    # the faulty sub-env's 40th step is vector step 39 (the reset is not a step)
    assert err.env_index == 2 and err.vector_step == 39 and err.rollout_step == 39 - 32
    assert "env 2" in str(err) and "vector step 39" in str(err)
    assert trainer.num_timesteps == 32 * 4  # one complete rollout before the fault


def test_box_actions_env_gets_clipped_buffer_keeps_raw():
    recorders = []

    def make():
        e = ActionRecorder(gym.make("Pendulum-v1"))
        recorders.append(e)
        return e
    env = same_step_vector_env([make, make])
    cfg = PPOConfig(n_envs=2, n_steps=16, batch_size=32, log_std_init=1.5)
    trainer = PPOTrainer(env, cfg, seed=0)
    r = trainer.collect_rollout()
    assert r.actions.shape == (16, 2, 1) and r.actions.dtype == np.float64
    assert np.abs(r.actions).max() > 2.0  # raw samples outside [-2, 2]
    for n, rec in enumerate(recorders):
        got = np.array(rec.received)
        np.testing.assert_array_equal(got, np.clip(r.actions[:, n], -2.0, 2.0))
    # log-probs are those of the raw samples
    flat_obs = r.observations.reshape(32, -1)
    log_probs = trainer.policy.evaluate(trainer.params, (flat_obs, r.actions.reshape(32, 1)))[0]
    np.testing.assert_allclose(log_probs, r.log_probs.reshape(32), rtol=0, atol=1e-12)


def test_reward_normalization_logs_raw_returns_and_obs_stats_freeze():
    cfg = PPOConfig(n_envs=2, n_steps=300, batch_size=600, normalize_observations=True,
                    normalize_rewards=True, gamma=0.9)
    trainer = PPOTrainer("Pendulum-v1", cfg, seed=0)
    r = trainer.collect_rollout()
    # Pendulum episodes are 200 steps with rewards in [-16.3, 0]: raw returns are large
    assert len(r.episode_returns) == 2 and all(-3300 < x < -100 for x in r.episode_returns)
    assert np.abs(r.rewards).max() < 16.0 and np.abs(r.rewards.sum(axis=0)).max() < 0.5 * abs(min(r.episode_returns))
    mean = trainer.collector.obs_moments.mean.copy()
    trainer.evaluate(1, deterministic=True)
    np.testing.assert_array_equal(trainer.collector.obs_moments.mean, mean)  # frozen during eval


def test_single_env_state_roundtrip_continues_identically():
    a = gym.make("CartPole-v1")
    a.reset(seed=5)
    for _ in range(7):
        a.step(1)
    state = single_env_state(a)
    assert state["unsupported"] == []
    b = gym.make("CartPole-v1")
    b.reset(seed=99)
    restore_single_env_state(b, state)
    for k in range(600):
        ra = a.step(k % 2)
        rb = b.step(k % 2)
        np.testing.assert_array_equal(ra[0], rb[0])
        assert ra[1:4] == rb[1:4]
        if ra[2] or ra[3]:
            np.testing.assert_array_equal(a.reset()[0], b.reset()[0])


def test_async_vector_env_collects_and_snapshots():
    env = make_vector_env("CartPole-v1", 2, vectorization="async")
    try:
        cfg = PPOConfig(n_envs=2, n_steps=8, batch_size=16)
        trainer = PPOTrainer(env, cfg, seed=0)
        trainer.collect_rollout()
        arrays, meta = trainer.collector.state_arrays()
        assert len(meta["sub_envs"]) == 2 and meta["unsupported"] == []
        trainer.collector.load_state(arrays, meta)
    finally:
        env.close()


def test_episode_statistics_are_the_raw_returns_of_the_rollout_rows():
    """The episodes a rollout reports (return, length, env, in step order then env order) are
    the sums of its raw reward rows since each env's episode began, carried across rollouts."""
    env = same_step_vector_env([lambda: gym.make("CartPole-v1", max_episode_steps=9 + i)
                                for i in range(3)])
    cfg = PPOConfig(n_envs=3, n_steps=13, batch_size=39)
    trainer = PPOTrainer(env, cfg, seed=2)
    running, length = np.zeros(3), np.zeros(3, np.int64)
    for _ in range(4):
        r = trainer.collect_rollout()
        want = []
        for t in range(r.n_steps):
            running += r.rewards[t]
            length += 1
            for i in np.flatnonzero(r.terminated[t] | r.truncated[t]):
                want.append((float(running[i]), int(length[i]), int(i)))
                running[i], length[i] = 0.0, 0
        assert list(zip(r.episode_returns, r.episode_lengths, r.episode_envs)) == want
        assert trainer.last_episodes == [(i, ret, n) for ret, n, i in want]
    assert trainer.n_episodes > 4
    trainer.close()


def test_observation_statistics_equal_gymnasium_running_mean_std():
    """spec.normalization's moments are gymnasium's ``RunningMeanStd`` (the same numbers, bit
    for bit, over successive batches) and the normalized batch is ``(x - mean) / sqrt(var +
    1e-8)``; the collector's statistics are those moments of every raw batch it observed (the
    reset included)."""
    from gymnasium.wrappers.utils import RunningMeanStd
    r = np.random.default_rng(11)
    for n in (1, 2, 7, 33, 256):
        for d in (1, 3, 11):
            moments, ref = initial_moments(d), RunningMeanStd(shape=(d,))
            scale = 10.0 ** r.integers(-3, 4, d)
            for _ in range(4):
                x = r.standard_normal((n, d)) * scale + r.standard_normal(d) * scale * 5
                x[:, r.integers(0, d)] = 0.0  # a zeroed column (CartPoleNoVel's velocities)
                moments = update_moments(moments, x)
                ref.update(x)
                assert np.array_equal(moments.mean, ref.mean) and np.array_equal(moments.var, ref.var)
                assert moments.count == ref.count
                want = (x - ref.mean) / np.sqrt(ref.var + OBS_NORM_EPS)
                assert np.array_equal(normalize_observations(x, moments), want)
                np.testing.assert_array_equal(normalize_observations(x, moments, 0.5),
                                              np.clip(want, -0.5, 0.5))
    # the collector: the moments of every raw batch the vector env returned (the reset's first)
    raw = []

    class Recording(SyncVectorEnv):
        def reset(self, **kwargs):
            obs, info = super().reset(**kwargs)
            raw.append(np.array(obs, dtype=np.float64))
            return obs, info

        def step(self, actions):
            out = super().step(actions)
            raw.append(np.array(out[0], dtype=np.float64))
            return out
    env = Recording([lambda: gym.make("CartPole-v1", max_episode_steps=5) for _ in range(2)],
                    autoreset_mode=AutoresetMode.SAME_STEP)
    trainer = PPOTrainer(env, PPOConfig(n_envs=2, n_steps=16, batch_size=32,
                                        normalize_observations=True), seed=0)
    r = trainer.collect_rollout()
    assert r.truncated.any() and len(raw) == 17
    moments, ref = initial_moments(4), RunningMeanStd(shape=(4,))
    for batch in raw:
        moments = update_moments(moments, batch)
        ref.update(batch)
    got = trainer.collector.obs_moments
    assert got.count == moments.count == ref.count
    assert np.array_equal(got.mean, ref.mean) and np.array_equal(got.var, ref.var)
    # row t is the raw batch t (0: the reset's) normalized with the statistics after merging it
    for t in (0, 7, 15):
        np.testing.assert_array_equal(r.observations[t],
                                      normalize_observations(raw[t], _moments_after(raw[:t + 1])))
    trainer.close()


def _moments_after(batches):
    moments = initial_moments(batches[0].shape[1])
    for batch in batches:
        moments = update_moments(moments, batch)
    return moments


def _clip_pair(clip):
    """Two Pendulum trainers, identical but for clip_observations/clip_rewards = ``clip`` on the
    second. policy_head_gain=0 makes the Gaussian mean exactly 0 whatever the observation, so
    both draw the same actions from the same generator and see the same raw trajectory."""
    base = dict(n_envs=2, n_steps=300, batch_size=600, normalize_observations=True,
                normalize_rewards=True, gamma=0.9, policy_head_gain=0.0)
    plain = PPOTrainer("Pendulum-v1", PPOConfig(**base), seed=4)
    clipped = PPOTrainer("Pendulum-v1", PPOConfig(**base, clip_observations=clip,
                                                  clip_rewards=clip), seed=4)
    return plain, clipped


def test_clipping_stores_clipped_values_and_keeps_statistics_raw():
    clip = 0.5
    plain, clipped = _clip_pair(clip)
    for _ in range(2):
        a = plain.collect_rollout()
        b = clipped.collect_rollout()
        np.testing.assert_array_equal(b.actions, a.actions)  # the same trajectory
        # the buffer stores clip(normalized): exactly the unclipped run's values, clipped
        np.testing.assert_array_equal(b.observations, np.clip(a.observations, -clip, clip))
        np.testing.assert_array_equal(b.rewards, np.clip(a.rewards, -clip, clip))
        assert (np.abs(a.observations) > clip).any() and (np.abs(a.rewards) > clip).any()
        assert np.abs(b.observations).max() <= clip and np.abs(b.rewards).max() <= clip
        # episode returns are logged from the raw rewards
        assert b.episode_returns == a.episode_returns and len(a.episode_returns) >= 2
    # statistics were updated with the raw, unclipped values: identical in both runs
    for name in ("mean", "var", "count"):
        np.testing.assert_array_equal(getattr(clipped.collector.obs_moments, name),
                                      getattr(plain.collector.obs_moments, name))
        np.testing.assert_array_equal(
            getattr(clipped.collector.reward_normalizer.return_rms, name),
            getattr(plain.collector.reward_normalizer.return_rms, name))
    # observations normalized later (final_obs, predict) go through the same clip
    raw = np.array([[100.0, -100.0, 0.0]])
    np.testing.assert_array_equal(clipped.collector.normalize_obs(raw),
                                  np.clip(plain.collector.normalize_obs(raw), -clip, clip))


def test_clipping_resume_is_exact(resumed_half_way):
    cfg = PPOConfig(n_envs=2, n_steps=128, batch_size=64, n_epochs=2, normalize_observations=True,
                    normalize_rewards=True, clip_observations=1.0, clip_rewards=0.5)
    full, part, resumed = resumed_half_way(cfg)
    assert resumed.config.clip_observations == 1.0 and resumed.config.clip_rewards == 0.5
    assert resumed.collector.clip_observations == 1.0 and resumed.collector.clip_rewards == 0.5
    for name in ("mean", "var", "count"):
        np.testing.assert_array_equal(getattr(resumed.collector.obs_moments, name),
                                      getattr(part.collector.obs_moments, name))
    resumed.learn(1024)
    for k in full.params:
        np.testing.assert_array_equal(resumed.params[k], full.params[k])
    for name in ("mean", "var", "count"):
        np.testing.assert_array_equal(getattr(resumed.collector.obs_moments, name),
                                      getattr(full.collector.obs_moments, name))
        np.testing.assert_array_equal(
            getattr(resumed.collector.reward_normalizer.return_rms, name),
            getattr(full.collector.reward_normalizer.return_rms, name))


def test_clip_settings_are_checked_where_a_run_is_configured():
    """Clipping is checked once, by the config every trainer is built from: a clip that is not
    a number > 0, or a clip without the normalization it applies after, is refused naming it."""
    with pytest.raises(ValueError, match="^clip_observations must be > 0"):
        PPOConfig(normalize_observations=True, clip_observations=0.0)
    with pytest.raises(ValueError, match="clip_rewards"):
        PPOConfig(normalize_rewards=True, clip_rewards="10")
    with pytest.raises(ValueError, match="^clip_rewards clips the normalized values"):
        PPOConfig(clip_rewards=10.0)
    with pytest.raises(ValueError, match="^clip_observations clips the normalized values"):
        PPOConfig(n_envs=1, n_steps=4, batch_size=4).replace(clip_observations=1.0)
