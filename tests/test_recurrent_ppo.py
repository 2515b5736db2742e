"""Tests of the recurrent PPO trainer (ppo_ref.train.recurrent_ppo): ratio = 1 on the first
minibatch across episode boundaries and rollout boundaries, the env partition of minibatches, the
state carried by collection, gradients of the whole trainer loss, and exact resume."""
import copy
import dataclasses

import gymnasium as gym
import numpy as np
import pytest
from gradcheck import check_gradients
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from ppo_ref.config import PPOConfig
from ppo_ref.spec.recurrent_networks import LSTMStates
from ppo_ref.spec.update import minibatch_loss, recurrent_minibatches
from ppo_ref.train.recurrent_ppo import RecurrentPPOTrainer, envs_per_minibatch
from ppo_ref.train.rollout import Rollout


class RandomWalkEnv(gym.Env):
    """Tiny continuous-action env: 3-d observation, Box(2) actions, reward -|a - obs[:2]|^2,
    terminates with probability 0.15 per step (from np_random); a TimeLimit adds truncations."""

    def __init__(self):
        self.observation_space = spaces.Box(-5.0, 5.0, (3,), np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float64)
        self._x = np.zeros(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._x = self.np_random.normal(size=3)
        return self._x.copy(), {}

    def step(self, action):
        reward = -float(np.sum((np.asarray(action) - self._x[:2]) ** 2))
        self._x = np.clip(0.8 * self._x + 0.3 * self.np_random.normal(size=3), -5, 5)
        return self._x.copy(), reward, bool(self.np_random.random() < 0.15), False, {}


def box_vector_env(n_envs, max_steps=6):
    fns = [lambda: gym.wrappers.TimeLimit(RandomWalkEnv(), max_episode_steps=max_steps)
           for _ in range(n_envs)]
    return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)


def small_config(**kw):
    base = dict(n_envs=4, n_steps=7, batch_size=14, n_epochs=2, learning_rate=3e-3,
                lstm_hidden_size=8, net_arch=(6,), ent_coef=0.01, gamma=0.9, gae_lambda=0.9)
    base.update(kw)
    return PPOConfig(**base)


def make_trainer(kind, lstm_shared=False, **kw):
    config = small_config(lstm_shared=lstm_shared, **kw)
    n_envs = config.n_envs
    if kind == "discrete":
        # CartPole without velocities, cut at 12 steps: truncations (bootstrapped through the
        # LSTM state) and terminations both occur, across 7-step rollouts
        return RecurrentPPOTrainer("ppo_ref/CartPoleNoVel-v1", config, seed=3,
                                   env_kwargs={"max_episode_steps": 12})
    return RecurrentPPOTrainer(box_vector_env(n_envs), config, seed=3)


# ---------------------------------------------------------------- minibatch partition

def test_envs_per_minibatch_and_divisibility_error():
    assert envs_per_minibatch(8, 32, 256) == 8
    assert envs_per_minibatch(8, 32, 64) == 2
    assert envs_per_minibatch(8, 32, 16) == 1      # batch smaller than a sequence: one env
    assert envs_per_minibatch(6, 32, 100) == 3     # remainder of batch_size / n_steps dropped
    with pytest.raises(ValueError, match="n_envs .6. must be divisible"):
        envs_per_minibatch(6, 8, 32)
    with pytest.raises(ValueError, match="batch_size"):
        RecurrentPPOTrainer("ppo_ref/MemoryCue-v0", PPOConfig(n_envs=6, n_steps=8, batch_size=32))


def test_float32_compute_reaches_the_policy_not_ignored():
    """compute_dtype="float32" runs the policy's passes in float32 (the carried state is
    float32); parameters and Adam stay float64, and the first minibatch has ratio exactly 1."""
    trainer = RecurrentPPOTrainer("ppo_ref/MemoryCue-v0", small_config(compute_dtype="float32"))
    assert trainer.policy.dtype == np.float32 and trainer.lstm_states.h.dtype == np.float32
    rollout = trainer.collect_rollout()
    assert trainer.update(rollout)["first_max_abs_log_ratio"] == 0.0
    assert all(v.dtype == np.float64 for v in trainer.params.values())
    assert all(v.dtype == np.float64 for v in trainer.adam_state["m"].values())
    trainer.close()


def test_recurrent_minibatches_are_whole_envs_from_their_start_state():
    """Each epoch of recurrent_minibatches is one permutation of the envs cut in groups; a
    group's minibatch holds those envs' whole [T, n] columns of every array, their start states
    and their episode starts (rows flattened t * n + j for the loss)."""
    T, N = 5, 6
    r = np.random.default_rng(0)
    arrays = [r.normal(size=(T, N)) for _ in range(4)]
    obs, actions = r.normal(size=(T, N, 3)), r.integers(0, 2, (T, N))
    start = LSTMStates(r.normal(size=(2, N, 4)), r.normal(size=(2, N, 4)))
    starts = r.random((T, N)) < 0.3
    for per in (1, 2, 3, 6):
        rng = np.random.default_rng(per)
        expected = copy.deepcopy(rng)
        per_epoch = recurrent_minibatches(rng, per, *arrays, obs, actions, start, starts)
        for epoch in range(2):
            perm = expected.permutation(N)
            groups = list(per_epoch(epoch))
            assert len(groups) == N // per
            for j, mb in enumerate(groups):
                envs = perm[j * per:(j + 1) * per]
                for got, full in zip(mb[:4], arrays):
                    np.testing.assert_array_equal(got, full[:, envs].reshape(-1))
                np.testing.assert_array_equal(mb.data[0], obs[:, envs])
                np.testing.assert_array_equal(mb.data[1], actions[:, envs])
                np.testing.assert_array_equal(mb.data[2].h, start.h[:, envs])
                np.testing.assert_array_equal(mb.data[2].c, start.c[:, envs])
                np.testing.assert_array_equal(mb.data[3], starts[:, envs])


def test_train_on_replays_each_env_once_per_epoch_as_whole_sequences():
    trainer = make_trainer("discrete", n_envs=6, batch_size=14, n_epochs=3)  # 2 envs / minibatch
    rollout = trainer.collect_rollout()
    seen = []
    evaluate = trainer.policy.evaluate  # what run_epochs calls for each minibatch

    def recording_evaluate(params, data):
        obs, actions, state, starts = data
        assert obs.shape[:2] == (7, 2)   # all T steps of 2 envs
        cols = [int(np.flatnonzero([np.array_equal(obs[:, j], rollout.observations[:, e])
                                    for e in range(6)])[0]) for j in range(obs.shape[1])]
        for j, e in enumerate(cols):
            np.testing.assert_array_equal(state.h[:, j], rollout.initial_state.h[:, e])
            np.testing.assert_array_equal(state.c[:, j], rollout.initial_state.c[:, e])
            np.testing.assert_array_equal(starts[:, j], rollout.episode_starts[:, e])
            np.testing.assert_array_equal(actions[:, j], rollout.actions[:, e])
        seen.append(cols)
        return evaluate(params, data)

    trainer.policy.evaluate = recording_evaluate
    stats = trainer.update(rollout)
    assert stats["n_epochs_run"] == 3 and len(seen) == 9
    for epoch in range(3):
        assert sorted(sum(seen[3 * epoch:3 * epoch + 3], [])) == list(range(6))


@pytest.mark.parametrize("kind,n_envs,batch_size", [
    ("discrete", 4, 28), ("discrete", 6, 14), ("box", 4, 7)])  # 1, 3 and 4 minibatches/epoch
def test_a_target_kl_that_never_fires_changes_nothing(kind, n_envs, batch_size):
    """A KL stop rule that never fires leaves two updates as without one: the same parameters,
    Adam state, stats, LSTM states and generator state, bit for bit."""
    results = []
    for target_kl in (None, 1e9):
        trainer = make_trainer(kind, n_envs=n_envs, batch_size=batch_size, n_epochs=3,
                               target_kl=target_kl)
        for _ in range(2):
            rollout = trainer.collect_rollout()
            adv, ret = trainer.compute_advantages(rollout)
            stats = trainer.train_on(rollout, adv, ret)
        results.append((trainer.params, trainer.adam_state, stats,
                        trainer.minibatch_rng.bit_generator.state, trainer.lstm_states))
        trainer.close()
    (p1, a1, s1, g1, h1), (p2, a2, s2, g2, h2) = results
    for k in p1:
        assert np.array_equal(p1[k], p2[k])
        assert np.array_equal(a1["m"][k], a2["m"][k]) and np.array_equal(a1["v"][k], a2["v"][k])
    assert np.array_equal(h1.h, h2.h) and np.array_equal(h1.c, h2.c) and g1 == g2
    assert s1["n_gradient_steps"] == 3 * (n_envs // max(1, batch_size // 7))
    for k in s1:
        assert s1[k] == s2[k] or (np.isnan(s1[k]) and np.isnan(s2[k])), k


@pytest.mark.parametrize("backend", ["fast", "spec"])
def test_train_on_a_bad_rollout_raises_before_any_step(backend):
    """A rollout with a non-finite observation or an action out of range: train_on raises
    (the compiled tier: one FloatingPointError naming the update, epoch and minibatch for the
    non-finite result, the distribution's ValueError for the action; the readable tier: the
    ValueError naming the input) and the update is all or nothing: parameters and Adam state
    stay as they were."""
    trainer = make_trainer("discrete", backend=backend)
    trainer.update(trainer.collect_rollout())
    rollout = trainer.collect_rollout()
    adv, ret = trainer.compute_advantages(rollout)
    bad_obs = rollout.observations.copy()
    bad_obs[3, -1, 0] = np.nan
    bad_actions = rollout.actions.copy()
    bad_actions[1, -1] = 5
    params, adam = copy.deepcopy((trainer.params, trainer.adam_state))
    update = trainer.n_updates  # (update() itself does not count: iteration() does)
    obs_error = ((FloatingPointError, rf"^update {update}, epoch 0, minibatch \d: ppo_ref\.fast\.")
                 if backend == "fast" else (ValueError, "obs must be finite"))
    for field, value, (error, match) in (
            ("observations", bad_obs, obs_error),
            ("actions", bad_actions, (ValueError, r"action.* (outside|must be in) \[0, (2|number)"))):
        bad = dataclasses.replace(rollout, **{field: value})
        with pytest.raises(error, match=match):
            trainer.train_on(bad, adv, ret)
        for k in params:
            assert np.array_equal(trainer.params[k], params[k])
            assert np.array_equal(trainer.adam_state["m"][k], adam["m"][k])
        assert trainer.adam_state["t"] == adam["t"]


# ---------------------------------------------------------------- collection and ratio = 1

@pytest.mark.parametrize("kind,lstm_shared,sizes", [
    ("discrete", False, {}), ("discrete", True, {}), ("box", False, {}),
    # benchmark-sized network (LSTM 64, tower [64], relu), 2 and 4 envs per minibatch
    ("discrete", False, dict(lstm_hidden_size=64, net_arch=(64,), activation="relu")),
    ("discrete", True, dict(lstm_hidden_size=64, net_arch=(64,), n_envs=8, batch_size=28)),
])
def test_first_minibatch_ratio_is_exactly_one_across_boundaries(kind, lstm_shared, sizes):
    trainer = make_trainer(kind, lstm_shared, **sizes)
    seen = dict(ended_mid_rollout=False, started_mid_episode=False, truncated=False,
                terminated=False)
    for i in range(6):
        rollout = trainer.collect_rollout()
        assert isinstance(rollout, Rollout) and rollout.initial_state is not None
        stats = trainer.update(rollout)
        # the first minibatch of every update recomputes the stored log-probs bit for bit
        assert stats["first_max_abs_log_ratio"] == 0.0
        seen["ended_mid_rollout"] |= bool(rollout.episode_starts[1:].any())
        seen["started_mid_episode"] |= bool((~rollout.episode_starts[0]).any()) and i > 0
        seen["truncated"] |= bool((rollout.truncated & ~rollout.terminated).any())
        seen["terminated"] |= bool(rollout.terminated.any())
    # the situations the test is about actually occurred
    assert all(seen.values()), seen
    assert np.abs(rollout.initial_state.h).max() > 0, "start state was zero"


@pytest.mark.parametrize("kind", ["discrete", "box"])
def test_replay_of_every_env_reproduces_collected_log_probs_and_values(kind):
    trainer = make_trainer(kind)
    trainer.update(trainer.collect_rollout())          # non-trivial parameters and carried state
    rollout = trainer.collect_rollout()
    start = rollout.initial_state
    for envs in (np.array([0, 1]), np.array([3, 2]), np.arange(4)):
        log_probs, _, values, _ = trainer.policy.evaluate(
            trainer.params, (rollout.observations[:, envs], rollout.actions[:, envs],
                             start.select(envs), rollout.episode_starts[:, envs]))
        np.testing.assert_array_equal(log_probs, rollout.log_probs[:, envs].reshape(-1))
        np.testing.assert_array_equal(values, rollout.values[:, envs].reshape(-1))


class FinalObsRecorder(gym.vector.VectorWrapper):
    """Pass-through vector wrapper recording info["final_obs"] of every step."""

    def __init__(self, env):
        super().__init__(env)
        self.final_obs = []

    def step(self, actions):
        out = self.env.step(actions)
        self.final_obs.append(out[4].get("final_obs"))
        return out

    @property
    def envs(self):
        return self.env.envs


def test_collection_carries_state_and_bootstraps_from_it():
    """The stored start state of rollout k+1 is the state after rollout k; last_values and
    final_values are the critic's values from the carried state, without advancing it; a
    truncated step's final observation continues the cut episode's memory (the state after
    the step, no reset)."""
    venv = FinalObsRecorder(box_vector_env(4, max_steps=3))
    trainer = RecurrentPPOTrainer(venv, small_config(), seed=5)
    policy, params, c = trainer.policy, trainer.params, trainer.config
    step = trainer.tier.recurrent_networks.recurrent_actor_critic_step  # the tier's public step
    r1 = trainer.collect_rollout()
    after = trainer.lstm_states.copy()
    # step-by-step replay from the stored start state reproduces the carried state
    states = []
    s = r1.initial_state
    net = {k: v for k, v in params.items() if k != "log_std"}   # the network's entries
    for t in range(r1.n_steps):
        _, _, s = step(net, r1.observations[t], s, r1.episode_starts[t], c.activation,
                       c.lstm_shared)
        states.append(s)
    np.testing.assert_array_equal(s.h, after.h)
    np.testing.assert_array_equal(s.c, after.c)
    expect_last = policy.values(params, trainer.collector.obs, after,
                                trainer.collector.episode_starts)
    np.testing.assert_array_equal(r1.last_values, expect_last)
    trunc = r1.truncated & ~r1.terminated
    assert trunc.any() and r1.final_values is not None
    assert np.all(r1.final_values[~trunc] == 0.0)
    for t, e in zip(*np.nonzero(trunc)):
        final_obs = np.asarray(venv.final_obs[-r1.n_steps + t][e], dtype=np.float64)[None]
        expected = policy.values(params, final_obs, states[t].select([e]), np.array([False]))
        assert r1.final_values[t, e] == expected[0]
        reset = policy.values(params, final_obs, states[t].select([e]), np.array([True]))
        assert r1.final_values[t, e] != reset[0]   # the memory was used
        if t + 1 < r1.n_steps:  # and the next row starts a new episode
            assert r1.episode_starts[t + 1, e]
    r2 = trainer.collect_rollout()
    np.testing.assert_array_equal(r2.initial_state.h, after.h)
    np.testing.assert_array_equal(r2.episode_starts[0], r1.terminated[-1] | r1.truncated[-1])


# ---------------------------------------------------------------- gradients of the whole loss

@pytest.mark.parametrize("kind,lstm_shared", [("discrete", False), ("discrete", True),
                                              ("box", False)])
def test_gradient_of_trainer_loss_matches_central_differences(kind, lstm_shared):
    """d(minibatch PPO loss)/d(params) through heads, towers and BPTT, on a tiny batch, with
    the policy moved away from the behaviour policy so ratios differ from 1 (float64)."""
    trainer = make_trainer(kind, lstm_shared, ent_coef=0.05, policy_head_gain=1.0)
    trainer.collect_rollout()
    rollout = trainer.collect_rollout()        # starts mid-episode from a non-zero state
    advantages, returns = trainer.compute_advantages(rollout)
    envs = np.array([2, 0])
    data = (rollout.observations[:, envs], rollout.actions[:, envs],
            rollout.initial_state.select(envs), rollout.episode_starts[:, envs])
    noise = np.random.default_rng(7)
    policy = trainer.policy
    params = {k: v + 0.5 * noise.normal(size=v.shape) for k, v in trainer.params.items()}
    old_log_probs, old_values = (rollout.log_probs[:, envs].reshape(-1),
                                 rollout.values[:, envs].reshape(-1))
    # clip ranges at the median deviation: both branches of each clipped term are exercised
    log_probs, _, values, _ = policy.evaluate(params, data)
    clip_range = float(np.median(np.abs(np.exp(log_probs - old_log_probs) - 1)))
    config = trainer.config.replace(clip_range_vf=float(np.median(np.abs(values - old_values))))

    def loss_of(p):
        log_probs, entropy, values, cache = policy.evaluate(p, data)
        return cache, minibatch_loss(log_probs, entropy, values, old_log_probs,
                                     advantages[:, envs].reshape(-1),
                                     returns[:, envs].reshape(-1), old_values, config=config,
                                     clip_range=clip_range, losses=trainer.tier.losses)

    cache, out = loss_of(params)
    assert 0.3 < out.clip_fraction < 0.7
    grads = policy.backward(params, cache, out.d_log_probs, out.d_entropy, out.d_values)
    assert list(grads) == list(params)
    # eps 1e-4: the loss sums O(100) terms of O(1), so with eps 1e-6 round-off (~1e-9) would
    # dominate gradients of ~1e-6; the truncation error O(eps^2) is far below tol here.
    check_gradients(lambda: loss_of(params)[1].loss, params, grads, eps=1e-4, tol=1e-5,
                    floor=1e-8, max_coords=30)


# ---------------------------------------------------------------- checkpoints

def test_resume_is_exact(tmp_path):
    config = small_config(n_steps=8, batch_size=16)
    straight = RecurrentPPOTrainer("ppo_ref/MemoryCue-v0", config, seed=1,
                                   env_kwargs={"blank_steps": 3})
    straight.learn(4 * 32)
    first = RecurrentPPOTrainer("ppo_ref/MemoryCue-v0", config, seed=1,
                                env_kwargs={"blank_steps": 3})
    first.learn(2 * 32)
    first.total_timesteps = 4 * 32  # schedules are constant here; keep the horizon identical
    path = first.save(tmp_path / "ckpt.npz")
    resumed = RecurrentPPOTrainer.load(path)
    assert isinstance(resumed, RecurrentPPOTrainer)
    np.testing.assert_array_equal(resumed.lstm_states.h, first.lstm_states.h)
    resumed.learn(4 * 32)
    assert set(resumed.params) == set(straight.params)
    for k in straight.params:
        np.testing.assert_array_equal(resumed.params[k], straight.params[k])
    np.testing.assert_array_equal(resumed.lstm_states.c, straight.lstm_states.c)


def test_load_state_rejects_missing_lstm_state():
    trainer = make_trainer("discrete")
    arrays = trainer.state_arrays()
    del arrays["collector/state.h"]
    with pytest.raises(ValueError, match="collector/state.h"):
        trainer.load_state_arrays(arrays)


def test_predict_carries_memory_explicitly():
    trainer = RecurrentPPOTrainer("ppo_ref/MemoryCue-v0", small_config(n_steps=8, batch_size=16),
                                  seed=0)
    obs = np.array([[1.0, 0.0], [-1.0, 0.0]])
    actions, state = trainer.predict(obs, deterministic=True)
    assert actions.shape == (2,) and isinstance(state, LSTMStates)
    assert state.h.shape == (2, 2, 8) and np.abs(state.h).max() > 0
    _, state2 = trainer.predict(np.zeros((2, 2)), True, state, episode_starts=[False, True])
    fresh = trainer.predict(np.zeros((2, 2)), True)[1]
    np.testing.assert_array_equal(state2.h[:, 1], fresh.h[:, 1])   # env 1 was reset
    assert not np.array_equal(state2.h[:, 0], fresh.h[:, 0])       # env 0 remembers its cue
    with pytest.raises(ValueError, match="episode_starts"):
        trainer.predict(np.zeros((2, 2)), True, state, episode_starts=[0, 2])
    with pytest.raises(ValueError, match="episode_starts"):
        trainer.predict(np.zeros((2, 2)), True, state, episode_starts=[True])
    with pytest.raises(ValueError, match="^state must be LSTMStates .* shape \\(2, 3, 8\\)"):
        trainer.predict(np.zeros((3, 2)), True, state)


def test_async_vector_env_gives_the_same_run_and_full_state_capture():
    from ppo_ref.io.checkpoint import array_to_json
    config = small_config(n_envs=2, batch_size=14, n_epochs=1)
    runs = []
    for vectorization in ("async", "sync"):
        trainer = RecurrentPPOTrainer("ppo_ref/CartPoleNoVel-v1", config, seed=0,
                                      vectorization=vectorization)
        try:
            trainer.learn(4 * 14)
            state = array_to_json(trainer.state_arrays()["state_json"])
            assert state["collector"]["unsupported"] == []
            runs.append(trainer.params)
        finally:
            trainer.close()
    for key in runs[0]:
        np.testing.assert_array_equal(runs[0][key], runs[1][key])


def test_spec_backend_trainer_runs_on_plain_dict_params():
    """backend="spec": the trainer acts, replays and trains through the readable tier with
    plain dict parameters (two updates on MemoryCue); the parameters move and stay finite, and
    the replay gives the acted log-probs to rounding."""
    config = PPOConfig(backend="spec", n_steps=16, n_envs=4, batch_size=32, n_epochs=2,
                       lstm_hidden_size=8, net_arch=(6,), learning_rate=3e-3)
    trainer = RecurrentPPOTrainer("ppo_ref/MemoryCue-v0", config, seed=0)
    assert trainer.tier.name == "spec" and trainer.policy.tier is trainer.tier
    before = {k: v.copy() for k, v in trainer.params.items()}
    for _ in range(2):
        rollout = trainer.collect_rollout()
        assert rollout.initial_state is not None
        stats = trainer.update(rollout)
        assert stats["n_epochs_run"] == 2 and np.isfinite(stats["loss"])
        assert stats["first_max_abs_log_ratio"] < 1e-12    # the replay, to rounding
    assert type(trainer.params) is dict and set(trainer.params) == set(before)
    assert all(np.isfinite(v).all() for v in trainer.params.values())
    assert any(not np.array_equal(trainer.params[k], before[k]) for k in before)
