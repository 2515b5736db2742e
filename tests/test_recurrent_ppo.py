"""Tests of the recurrent PPO trainer (ppo_ref.recurrent_ppo): ratio = 1 on the first minibatch
across episode boundaries and rollout boundaries, the env partition of minibatches, the state
carried by collection, gradients of the whole trainer loss, and exact resume."""
import gymnasium as gym
import numpy as np
import pytest
from gradcheck import check_gradients
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from ppo_ref.config import PPOConfig
from ppo_ref.recurrent_policies import LSTMStates, recurrent_actor_critic_step
from ppo_ref.recurrent_ppo import (RecurrentPPOTrainer, RecurrentRollout, checked_passes,
                                   env_minibatches, envs_per_minibatch)
from ppo_ref.fast.update import minibatch_loss


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
    """compute_dtype="float32" runs the policy's passes in float32 (tests/test_recurrent_fast.py
    checks them against float64); parameters and Adam stay float64."""
    trainer = RecurrentPPOTrainer("ppo_ref/MemoryCue-v0", small_config(compute_dtype="float32"))
    assert trainer.policy.compute_dtype == np.float32
    rollout = trainer.collect_rollout()
    assert trainer.update(rollout)["first_max_abs_log_ratio"] == 0.0
    assert trainer.params.flat.dtype == np.float64


def test_env_minibatches_cover_every_env_once():
    rng = np.random.default_rng(0)
    for n_envs, per in ((8, 2), (6, 3), (5, 5), (4, 1)):
        groups = env_minibatches(rng, n_envs, per)
        assert len(groups) == n_envs // per and all(len(g) == per for g in groups)
        assert sorted(np.concatenate(groups).tolist()) == list(range(n_envs))


def test_train_on_replays_each_env_once_per_epoch_as_whole_sequences():
    trainer = make_trainer("discrete", n_envs=6, batch_size=14, n_epochs=3)  # 2 envs / minibatch
    rollout = trainer.collect_rollout()
    seen = []
    # the replay every path runs (the checked evaluate and the update's passes alike)
    original = trainer.policy._evaluate_envs

    def recording_evaluate(params, spec, flat, stacked, obs, h0, c0, keep, *rest):
        assert obs.shape[:2] == (7, 2)   # all T steps of 2 envs
        cols = [int(np.flatnonzero([np.array_equal(obs[:, j], rollout.observations[:, e])
                                    for e in range(6)])[0]) for j in range(obs.shape[1])]
        for j, e in enumerate(cols):
            np.testing.assert_array_equal(h0[:, j], rollout.initial_lstm_states.h[:, e])
            np.testing.assert_array_equal(c0[:, j], rollout.initial_lstm_states.c[:, e])
            np.testing.assert_array_equal(keep[:7, j], 1.0 - rollout.episode_starts[:, e])
            assert keep[7, j] == 1.0
        seen.append(cols)
        return original(params, spec, flat, stacked, obs, h0, c0, keep, *rest)

    trainer.policy._evaluate_envs = recording_evaluate
    stats = trainer.update(rollout)
    assert stats["n_epochs_run"] == 3 and len(seen) == 9
    for epoch in range(3):
        assert sorted(sum(seen[3 * epoch:3 * epoch + 3], [])) == list(range(6))


@pytest.mark.parametrize("kind,n_envs,batch_size", [
    ("discrete", 4, 28), ("discrete", 6, 14), ("box", 4, 7)])  # 1, 3 and 4 minibatches/epoch
def test_train_on_all_epochs_gather_equals_per_epoch_path(kind, n_envs, batch_size):
    """Without a KL stop, train_on draws every epoch's env permutation at once and gathers each
    array once per update (C-contiguous blocks); with a target_kl that never fires it takes the
    per-epoch path: same parameters, Adam state, stats, LSTM states and generator state, bit
    for bit."""
    from ppo_ref.fast.update import recurrent_minibatches
    results = []
    for target_kl in (None, 1e9):
        trainer = make_trainer(kind, n_envs=n_envs, batch_size=batch_size, n_epochs=3,
                               target_kl=target_kl)
        for _ in range(2):
            rollout = trainer.collect_rollout()
            adv, ret = trainer.compute_advantages(rollout)
            stats = trainer.train_on(rollout, adv, ret)
        results.append((trainer.params.flat.copy(), trainer.adam_state["m"].flat.copy(),
                        trainer.adam_state["v"].flat.copy(), stats,
                        trainer.minibatch_rng.bit_generator.state,
                        trainer.lstm_states.h.copy()))
    (p1, m1, v1, s1, g1, h1), (p2, m2, v2, s2, g2, h2) = results
    assert np.array_equal(p1, p2) and np.array_equal(m1, m2) and np.array_equal(v1, v2)
    assert np.array_equal(h1, h2) and g1 == g2
    assert s1["n_gradient_steps"] == 3 * (n_envs // max(1, batch_size // 7))
    for k in s1:
        assert s1[k] == s2[k] or (np.isnan(s1[k]) and np.isnan(s2[k])), k
    # the all-epochs blocks are the per-epoch gathers of the same envs, each C-contiguous
    r = np.random.default_rng(5)
    perms = np.stack([r.permutation(n_envs) for _ in range(3)])
    per = max(1, batch_size // 7)
    start = rollout.initial_lstm_states
    minibatches = recurrent_minibatches(np.random.default_rng(5), per, rollout.log_probs, adv,
                                        ret, rollout.values, rollout.observations,
                                        rollout.actions, start, rollout.episode_starts,
                                        n_epochs=3, target_kl=None)
    for e in range(3):
        for j, mb in enumerate(minibatches(e)):
            envs = perms[e, j * per:(j + 1) * per]
            got = (mb.old_log_probs, mb.advantages, mb.returns, mb.old_values, mb.data[0],
                   mb.data[1], mb.data[2].h, mb.data[2].c, mb.data[3])
            want = (rollout.log_probs[:, envs].reshape(-1), adv[:, envs].reshape(-1),
                    ret[:, envs].reshape(-1), rollout.values[:, envs].reshape(-1),
                    rollout.observations[:, envs], rollout.actions[:, envs], start.h[:, envs],
                    start.c[:, envs], rollout.episode_starts[:, envs])
            for g, w in zip(got, want):
                assert g.flags.c_contiguous and g.dtype == w.dtype
                assert np.array_equal(g, w)


@pytest.mark.parametrize("kind,lstm_shared,compute_dtype", [
    ("discrete", False, "float64"), ("box", True, "float64"), ("discrete", True, "float32"),
    ("box", False, "float32")])
def test_train_on_passes_equal_the_checked_evaluate_and_backward(kind, lstm_shared,
                                                                  compute_dtype):
    """train_on's update passes (the rollout checked once: RecurrentPolicy._update_passes) give
    the parameters, Adam state and stats of the checked path (the public evaluate and
    backward at every minibatch on the rollout's own arrays), bit for bit, over two updates
    of 2 env groups per epoch."""
    results = []
    passes_made = []
    for checked in (False, True):
        trainer = make_trainer(kind, lstm_shared=lstm_shared, compute_dtype=compute_dtype,
                               n_envs=4, batch_size=14, n_epochs=2)
        policy = trainer.policy
        original = policy._update_passes

        public_evaluate, public_backward = checked_passes(policy)

        def passes(obs, actions, state, episode_starts):
            if checked:  # the rollout's arrays as they are, every call checked
                return obs, actions, state, episode_starts, public_evaluate, public_backward
            made = original(obs, actions, state, episode_starts)
            passes_made.append(made)
            return made
        policy._update_passes = passes
        for _ in range(2):
            stats = trainer.update(trainer.collect_rollout())
        results.append((trainer.params.flat.copy(), trainer.adam_state["m"].flat.copy(),
                        trainer.adam_state["v"].flat.copy(), stats))
    (p1, m1, v1, s1), (p2, m2, v2, s2) = results
    assert np.array_equal(p1, p2) and np.array_equal(m1, m2) and np.array_equal(v1, v2)
    assert s1["n_gradient_steps"] == 4 and len(passes_made) == 2  # the passes ran (run 1)
    for k in s1:
        assert s1[k] == s2[k] or (np.isnan(s1[k]) and np.isnan(s2[k])), k


@pytest.mark.parametrize("target_kl", [None, 1e-12])
def test_train_on_a_bad_rollout_raises_the_error_of_evaluate(target_kl):
    """A rollout the update's passes refuse (a non-finite observation, an action out of range)
    raises, from train_on, the error the public evaluate gives for it, before any step: also
    when a KL stop (a target far below any step's KL) would end the update at its first
    minibatch, before the minibatch holding the bad entries; parameters and Adam state stay
    as they were."""
    trainer = make_trainer("discrete", target_kl=target_kl)
    trainer.update(trainer.collect_rollout())
    rollout = trainer.collect_rollout()
    adv, ret = trainer.compute_advantages(rollout)
    bad_obs = rollout.observations.copy()
    bad_obs[3, -1, 0] = np.nan
    bad_actions = rollout.actions.copy()
    bad_actions[1, -1] = 5
    params = trainer.params.flat.copy()
    moments = trainer.adam_state["m"].flat.copy()
    for field, value, match in (("observations", bad_obs, "obs must be finite"),
                                ("actions", bad_actions, r"actions must be in \[0, 2\)")):
        bad = RecurrentRollout(**{**vars(rollout), field: value})
        with pytest.raises(ValueError, match=match):
            trainer.train_on(bad, adv, ret)
        assert np.array_equal(trainer.params.flat, params)
        assert np.array_equal(trainer.adam_state["m"].flat, moments)


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
        assert isinstance(rollout, RecurrentRollout)
        stats = trainer.update(rollout)
        # the first minibatch of every update recomputes the stored log-probs bit for bit
        assert stats["first_max_abs_log_ratio"] == 0.0
        seen["ended_mid_rollout"] |= bool(rollout.episode_starts[1:].any())
        seen["started_mid_episode"] |= bool((~rollout.episode_starts[0]).any()) and i > 0
        seen["truncated"] |= bool((rollout.truncated & ~rollout.terminated).any())
        seen["terminated"] |= bool(rollout.terminated.any())
    # the situations the test is about actually occurred
    assert all(seen.values()), seen
    assert np.abs(rollout.initial_lstm_states.h).max() > 0, "start state was zero"


@pytest.mark.parametrize("kind", ["discrete", "box"])
def test_replay_of_every_env_reproduces_collected_log_probs_and_values(kind):
    trainer = make_trainer(kind)
    trainer.update(trainer.collect_rollout())          # non-trivial parameters and carried state
    rollout = trainer.collect_rollout()
    start = rollout.initial_lstm_states
    for envs in (np.array([0, 1]), np.array([3, 2]), np.arange(4)):
        ev = trainer.policy.evaluate(trainer.params, rollout.observations[:, envs],
                                     rollout.actions[:, envs], start.select(envs),
                                     rollout.episode_starts[:, envs])
        np.testing.assert_array_equal(ev.log_probs, rollout.log_probs[:, envs])
        np.testing.assert_array_equal(ev.values, rollout.values[:, envs])


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
    truncated step's final observation continues the cut episode's memory (no reset)."""
    venv = FinalObsRecorder(box_vector_env(4, max_steps=3))
    trainer = RecurrentPPOTrainer(venv, small_config(), seed=5)
    policy, params = trainer.policy, trainer.params
    r1 = trainer.collect_rollout()
    after = trainer.lstm_states.copy()
    # step-by-step replay from the stored start state reproduces the carried state
    states = []
    s = r1.initial_lstm_states
    net = {k: v for k, v in params.items() if k != "log_std"}   # the network's entries
    for t in range(r1.n_steps):
        _, _, s = recurrent_actor_critic_step(net, r1.observations[t], s,
                                              r1.episode_starts[t], policy.activation,
                                              policy.lstm_shared)
        states.append(s)
    # the spec network's steps: RecurrentPolicy's stated float64 tolerance
    np.testing.assert_allclose(s.h, after.h, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(s.c, after.c, rtol=1e-12, atol=1e-13)
    expect_last = policy.values(params, trainer.collector.obs, after,
                                trainer.collector.episode_starts)
    np.testing.assert_array_equal(r1.last_values, expect_last)
    trunc = r1.truncated & ~r1.terminated
    assert trunc.any() and r1.final_values is not None
    assert np.all(r1.final_values[~trunc] == 0.0)
    for t, e in zip(*np.nonzero(trunc)):
        final_obs = np.asarray(venv.final_obs[-r1.n_steps + t][e], dtype=np.float64)[None]
        expected = policy.values(params, final_obs, states[t].select([e]), [False])
        np.testing.assert_allclose(r1.final_values[t, e], expected[0], rtol=1e-12, atol=1e-14)
        reset = policy.values(params, final_obs, states[t].select([e]), [True])
        assert r1.final_values[t, e] != reset[0]   # the memory was used
    r2 = trainer.collect_rollout()
    np.testing.assert_array_equal(r2.initial_lstm_states.h, after.h)
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
            rollout.initial_lstm_states.select(envs), rollout.episode_starts[:, envs])
    noise = np.random.default_rng(7)
    policy = trainer.policy
    params = policy.as_flat({k: v + 0.5 * noise.normal(size=v.shape)
                             for k, v in trainer.params.items()})
    # clip ranges at the median deviation: both branches of each clipped term are exercised
    ev = policy.evaluate(params, *data)
    clip_range = float(np.median(np.abs(np.exp(ev.log_probs - rollout.log_probs[:, envs]) - 1)))
    config = trainer.config.replace(clip_range_vf=float(np.median(
        np.abs(ev.values - rollout.values[:, envs]))))

    def loss_of(p):
        ev = policy.evaluate(p, *data)
        return ev, minibatch_loss(ev.log_probs, ev.entropy, ev.values, rollout.log_probs[:, envs],
                                  advantages[:, envs], returns[:, envs], rollout.values[:, envs],
                                  config=config, clip_range=clip_range)

    ev, out = loss_of(params)
    assert 0.3 < out.clip_fraction < 0.7
    grads = policy.backward(params, ev.cache, out.d_log_probs, out.d_entropy, out.d_values)
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
    del arrays["lstm/h"]
    with pytest.raises(ValueError, match="lstm/h"):
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
    with pytest.raises(ValueError, match="state.h"):
        trainer.predict(np.zeros((3, 2)), True, state)


def test_stored_log_probs_come_from_the_replay_even_if_the_collector_does_not_replay():
    """A collector that keeps acting-time values (no call to the actor's evaluate) still yields
    replayed log-probs/values: the trainer recomputes them."""
    trainer = make_trainer("discrete", lstm_hidden_size=64, net_arch=(64,))
    reference = trainer.collect_rollout()
    real_collect = trainer.collector.collect

    def acting_time_collect(params, rng):
        rollout = real_collect(params, rng)
        trainer._actor.replayed = False
        rollout.log_probs = np.full_like(rollout.log_probs, np.nan)
        rollout.values = np.full_like(rollout.values, np.nan)
        return rollout

    trainer.collector.collect = acting_time_collect
    rollout = trainer.collect_rollout()
    assert rollout.initial_lstm_states.h.shape == reference.initial_lstm_states.h.shape
    ev = trainer.policy.evaluate(trainer.params, rollout.observations, rollout.actions,
                                 rollout.initial_lstm_states, rollout.episode_starts)
    np.testing.assert_array_equal(rollout.log_probs, ev.log_probs)
    np.testing.assert_array_equal(rollout.values, ev.values)
    assert trainer.update(rollout)["first_max_abs_log_ratio"] == 0.0


def test_async_vector_env_gives_the_same_run_and_full_state_capture():
    from ppo_ref.checkpoint import array_to_json
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
    """backend="spec": the trainer acts, replays and trains through SpecRecurrentPolicy with
    plain dict parameters (two updates on MemoryCue); the parameters move and stay finite."""
    from ppo_ref.recurrent_policies import SpecRecurrentPolicy
    config = PPOConfig(backend="spec", n_steps=16, n_envs=4, batch_size=32, n_epochs=2,
                       lstm_hidden_size=8, net_arch=(6,), learning_rate=3e-3)
    trainer = RecurrentPPOTrainer("ppo_ref/MemoryCue-v0", config, seed=0)
    assert isinstance(trainer.policy, SpecRecurrentPolicy)
    before = {k: v.copy() for k, v in trainer.params.items()}
    for _ in range(2):
        rollout = trainer.collect_rollout()
        assert isinstance(rollout, RecurrentRollout)
        stats = trainer.update(rollout)
        assert stats["n_epochs_run"] == 2 and np.isfinite(stats["loss"])
        assert stats["first_max_abs_log_ratio"] < 1e-12    # the replay, to rounding
    assert type(trainer.params) is dict and set(trainer.params) == set(before)
    assert all(np.isfinite(v).all() for v in trainer.params.values())
    assert any(not np.array_equal(trainer.params[k], before[k]) for k in before)


@pytest.mark.parametrize("kind", ["discrete", "box"])
def test_the_rollout_replay_from_acted_outputs_equals_the_full_replay(kind):
    """The actor's evaluate of the rollout just acted runs the towers and head on the kept LSTM
    outputs; its log-probs and values are the full replay's bit for bit. Anything that differs
    from what was acted (another parameter, observation or flag) gets the full replay."""
    trainer = make_trainer(kind)
    rollout = trainer.collect_rollout()
    actor = trainer._actor
    assert actor.acted is not None and len(actor.acted.h) == rollout.rewards.shape[0]
    T, N = rollout.rewards.shape
    flat_obs = rollout.observations.reshape(T * N, -1)
    flat_actions = rollout.actions.reshape((T * N,) + rollout.actions.shape[2:])
    full = trainer.policy.evaluate(trainer.params, rollout.observations, rollout.actions,
                                   rollout.initial_lstm_states, rollout.episode_starts)
    np.testing.assert_array_equal(rollout.log_probs, full.log_probs)
    np.testing.assert_array_equal(rollout.values, full.values)
    calls = []
    real = trainer.policy.evaluate_hidden
    trainer.policy.evaluate_hidden = lambda *a: calls.append(1) or real(*a)
    ev = actor.evaluate(trainer.params, flat_obs, flat_actions,
                        episode_starts=rollout.episode_starts)
    assert calls == [1]
    np.testing.assert_array_equal(ev.log_probs, full.log_probs.reshape(-1))
    np.testing.assert_array_equal(ev.values, full.values.reshape(-1))
    # changed parameters / observations / flags: the full replay of what was asked
    params = trainer.policy.as_flat(trainer.params)
    params.flat[0] += 1e-3
    obs = flat_obs.copy()
    obs[5, 0] = -obs[5, 0] if obs[5, 0] != 0 else 1.0
    starts = rollout.episode_starts.copy()
    starts[2, 1] = not starts[2, 1]
    for p, o, s in ((params, flat_obs, rollout.episode_starts),
                    (trainer.params, obs, rollout.episode_starts),
                    (trainer.params, flat_obs, starts)):
        ev = actor.evaluate(p, o, flat_actions, episode_starts=s)
        want = trainer.policy.evaluate(p, o.reshape(T, N, -1), rollout.actions,
                                       rollout.initial_lstm_states, s)
        np.testing.assert_array_equal(ev.log_probs, want.log_probs.reshape(-1))
        np.testing.assert_array_equal(ev.values, want.values.reshape(-1))
    assert calls == [1]
