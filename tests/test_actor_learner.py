"""Actor-learner loop (docs/specification.md §6), thread actors: config, messages, FIFO order, lockstep
on-policy behaviour, V-trace vs GAE, failure handling, learning.

Process actors are exercised in tests/test_actor_learner_process.py (spawn start-up is
slow, so those tests are few)."""
import functools
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from ppo_ref.distributed import (
    ActorDiedError, ActorGroup, AsyncActorLearnerConfig, Experience, ExperienceBatch,
    ExperienceError, PolicyBroadcast, Shutdown, StarvationError, learner_loop, make_learner,
    start_actors,
)
from ppo_ref.distributed.learner import _ActorFifo, _check_experience_batch
from ppo_ref.config import PPOConfig
from ppo_ref import gae

SMALL_PPO = PPOConfig(n_epochs=2, batch_size=32)


def small_config(**changes):
    # starvation_timeout 60 s (the default, as the other actor-learner tests): the actors'
    # first steps compile their kernels when the numba cache is cold (a fresh clone in CI),
    # which took more than 20 s on a loaded 2-core machine
    base = dict(num_actors=2, n_steps=32, total_timesteps=2 * 32 * 4, actors="thread",
                ppo=SMALL_PPO, starvation_timeout=60.0)
    base.update(changes)
    return AsyncActorLearnerConfig(**base)


def no_actor_threads_left():
    return not any(t.name.startswith("ppo_ref-actor-") and t.is_alive()
                   for t in threading.enumerate())


# ---------------------------------------------------------------------------------------------
# Test environments
# ---------------------------------------------------------------------------------------------

class CounterEnv(gym.Env):
    """Deterministic env whose observations identify the actor and number every step.

    observation = [tag, count, t]: ``tag`` is the seed of the first reset (seed + 1 + agent_id
    for an actor), ``count`` the env steps taken so far (never reset), ``t`` the step within the
    episode. reward = count after the step. Episodes terminate after 7 steps, except that an
    episode is truncated at its 5th step when count is a multiple of 3.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.tag = -1.0
        self.count = 0
        self.t = 0

    def _obs(self):
        return np.array([self.tag, self.count, self.t], dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.tag = float(seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.count += 1
        self.t += 1
        terminated = self.t == 7
        truncated = self.t == 5 and self.count % 3 == 0
        return self._obs(), float(self.count), terminated, truncated, {}


class CrashingEnv(gym.Wrapper):
    """CartPole that raises (or exits the process) at its ``after``-th step, but only in the
    actor whose reset seed is ``crash_seed``."""

    def __init__(self, crash_seed, after, how, stamp_path=None):
        super().__init__(gym.make("CartPole-v1"))
        self.crash_seed, self.after, self.how = crash_seed, after, how
        self.stamp_path = stamp_path            # the crash's wall-clock time is written here
        self.armed = False
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.armed = seed == self.crash_seed
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.armed and self.steps == self.after:
            if self.stamp_path is not None:
                with open(self.stamp_path, "w") as fh:
                    fh.write(repr(time.time()))
            if self.how == "exit":
                import os
                os._exit(3)
            raise RuntimeError("env exploded")
        return self.env.step(action)


def crashing_env(crash_seed, after, how, stamp_path=None):
    return CrashingEnv(crash_seed, after, how, stamp_path)


def silent_actor(agent_id, env, config, send, receive, learner_gone, *, chunk_size):
    """Never sends an experience; waits for Shutdown (to provoke starvation)."""
    while True:
        msg = receive(0.05)
        if isinstance(msg, Shutdown) or learner_gone():
            return None


def wrong_id_actor(agent_id, env, config, send, receive, learner_gone, *, chunk_size):
    """Sends one experience with an agent_id outside [0, num_actors), then waits."""
    obs = np.zeros(4)
    send(Experience(config.num_actors + agent_id, obs, 0, 1.0, obs, False, False, 0.0, -0.69, 0))
    return silent_actor(agent_id, env, config, send, receive, learner_gone,
                        chunk_size=chunk_size)


def gap_actor(agent_id, env, config, send, receive, learner_gone, *, chunk_size):
    """Sends consecutive CartPole-shaped steps with one step missing (step 5 of 40)."""
    steps = [Experience(agent_id, np.full(4, float(i)), 0, 1.0, np.full(4, float(i + 1)), False,
                        False, 0.0, -0.69, 0) for i in range(config.n_steps + 1) if i != 5]
    send(ExperienceBatch.from_experiences(steps))
    return silent_actor(agent_id, env, config, send, receive, learner_gone,
                        chunk_size=chunk_size)


def wrong_shape_actor(agent_id, env, config, send, receive, learner_gone, *, chunk_size):
    """Sends one experience whose observation has 6 entries instead of CartPole's 4."""
    obs = np.zeros(6)
    send(Experience(agent_id, obs, 0, 1.0, obs, False, False, 0.0, -0.69, 0))
    return silent_actor(agent_id, env, config, send, receive, learner_gone,
                        chunk_size=chunk_size)


# ---------------------------------------------------------------------------------------------
# Config and messages
# ---------------------------------------------------------------------------------------------

def test_config_defaults_and_derived_values():
    c = AsyncActorLearnerConfig()
    assert (c.num_actors, c.n_steps, c.total_timesteps, c.broadcast_every) == (4, 256, 200_000, 1)
    assert c.max_lead_steps == 0 and c.lead_limit == 2 * 256
    assert (c.gamma, c.gae_lambda, c.use_vtrace) == (0.99, 0.95, False)
    assert (c.rho_bar, c.c_bar) == (1.0, 1.0)
    assert (c.seed, c.starvation_timeout, c.actors, c.ray_address) == (0, 60.0, "process", None)
    # whole updates reaching at least total_timesteps (200_000 / 1024 = 195.3 -> 196)
    assert c.num_updates == 196 and 195 * 1024 < 200_000 <= 196 * 1024
    assert AsyncActorLearnerConfig(total_timesteps=10).num_updates == 1
    assert AsyncActorLearnerConfig(total_timesteps=2 * 1024).num_updates == 2
    lp = c.learner_ppo_config()
    assert (lp.n_steps, lp.n_envs, lp.gamma, lp.gae_lambda) == (256, 4, 0.99, 0.95)
    c2 = AsyncActorLearnerConfig(broadcast_every=3, n_steps=20, max_lead_steps=60)
    assert c2.lead_limit == 60
    assert AsyncActorLearnerConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize("changes, field", [
    (dict(num_actors=0), "num_actors"),
    (dict(n_steps=-1), "n_steps"),
    (dict(total_timesteps=0), "total_timesteps"),
    (dict(broadcast_every=0), "broadcast_every"),
    (dict(max_lead_steps=-3), "max_lead_steps"),
    (dict(n_steps=64, broadcast_every=2, max_lead_steps=127), "max_lead_steps"),
    (dict(gamma=1.5), "gamma"),
    (dict(gae_lambda=-0.1), "gae_lambda"),
    (dict(use_vtrace=1), "use_vtrace"),
    (dict(rho_bar=0.0), "rho_bar"),
    (dict(c_bar=-1.0), "c_bar"),
    (dict(seed=-1), "seed"),
    (dict(starvation_timeout=0), "starvation_timeout"),
    (dict(actors="fork"), "actors"),
    (dict(actors="thread", ray_address="127.0.0.1:6379"), "ray_address"),
    (dict(actors="ray", ray_address=""), "ray_address"),
    (dict(ppo={"n_epochs": 3}), "ppo"),
    (dict(n_steps=8, num_actors=2, ppo=PPOConfig(batch_size=64)), "batch_size"),
    (dict(ppo=PPOConfig(normalize_observations=True)), "ppo.normalize_observations"),
])
def test_config_rejects_bad_values_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        AsyncActorLearnerConfig(**changes)


def test_lead_equal_to_one_broadcast_period_is_accepted():
    c = AsyncActorLearnerConfig(n_steps=64, broadcast_every=2, max_lead_steps=128)
    assert c.lead_limit == 128


def test_experience_batch_round_trip_keeps_order_and_content(rng):
    exps = [Experience(1, rng.normal(size=4), int(rng.integers(2)), float(rng.normal()),
                       rng.normal(size=4), bool(rng.integers(2)), bool(rng.integers(2)),
                       float(rng.normal()), float(-rng.random()), i // 3) for i in range(7)]
    batch = ExperienceBatch.from_experiences(exps)
    assert len(batch) == 7 and batch.observations.shape == (7, 4)
    back = batch.experiences()
    for a, b in zip(exps, back):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="agent_id"):
        ExperienceBatch.from_experiences([exps[0], exps[1]._replace(agent_id=0)])


def test_fifo_takes_oldest_rows_and_keeps_the_rest():
    fifo = _ActorFifo(0)
    sent = 0
    for size in (5, 1, 7, 3, 9, 2):                       # chunk sizes unrelated to n
        rows = np.arange(sent, sent + size, dtype=np.float64)
        fifo.push(ExperienceBatch(0, rows[:, None], rows.astype(np.int64), rows, rows[:, None],
                                  np.zeros(size, bool), np.zeros(size, bool), rows, rows,
                                  np.zeros(size, np.int64)))
        sent += size
    taken = [fifo.take(4).rewards for _ in range(6)]
    np.testing.assert_array_equal(np.concatenate(taken), np.arange(24))
    assert fifo.count == sent - 24 == 3
    np.testing.assert_array_equal(fifo.take(3).observations[:, 0], [24, 25, 26])
    assert fifo.count == 0


# ---------------------------------------------------------------------------------------------
# Lockstep = on-policy; V-trace = GAE(1) on-policy
# ---------------------------------------------------------------------------------------------

def test_lockstep_gives_zero_policy_lag_and_ratio_one():
    config = small_config(max_lead_steps=32, broadcast_every=1)
    infos = []
    trainer = make_learner(config, "CartPole-v1")
    trainer, report = learner_loop(config, trainer, "CartPole-v1", callback=infos.append)
    assert report.updates == 4 and len(infos) == 4
    assert report.env_steps == 4 * 64 == trainer.num_timesteps
    assert report.broadcasts == 5 and report.last_version == 4      # version 0 + one per update
    for info in infos:
        assert np.all(info.policy_versions == info.version)          # every experience: lag 0
        assert info.version == info.update - 1
        # The learner recomputes the behaviour log-probs: ratio 1 in the first minibatch, to
        # float64 rounding (actors evaluate their chunk of steps, the learner a minibatch of
        # another size: BLAS may sum a hidden unit's products in another order; measured here:
        # exactly 0, and 1.1e-16 with an earlier per-observation path).
        assert info.stats["first_max_abs_log_ratio"] <= 1e-12
    assert report.policy_lag_mean == [0.0] * 4 and report.policy_lag_max == [0] * 4
    for stats in report.actor_stats:
        assert stats is not None
        # Lockstep: at most n_steps beyond what was consumed (the final version allows one more).
        assert 4 * 32 <= stats.steps_sent <= 5 * 32
    assert no_actor_threads_left()


def test_on_policy_vtrace_equals_gae_with_lambda_one():
    # Short time limit: truncations inside the buffer exercise final_values too.
    env = functools.partial(gym.make, "CartPole-v1", max_episode_steps=12)
    config = small_config(max_lead_steps=32, use_vtrace=True, gae_lambda=1.0, gamma=0.9)
    infos = []
    learner_loop(config, make_learner(config, env), env, callback=infos.append)
    assert any(info.rollout.truncated.any() and info.rollout.terminated.any() for info in infos)
    for info in infos:
        r = info.rollout
        assert np.all(info.policy_versions == info.version)
        adv, ret = gae(r.rewards, r.values, r.terminated, r.truncated, r.last_values,
                       r.final_values, gamma=0.9, gae_lambda=1.0)
        np.testing.assert_allclose(info.advantages, adv, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(info.returns, ret, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# Order, nothing dropped, bookkeeping
# ---------------------------------------------------------------------------------------------

def counter_episodes(n_steps_total):
    """Returns and lengths of the CounterEnv episodes completed within its first steps."""
    env = CounterEnv()
    env.reset(seed=0)
    returns, lengths, ret, length = [], [], 0.0, 0
    for _ in range(n_steps_total):
        _, r, term, trunc, _ = env.step(0)
        ret += r
        length += 1
        if term or trunc:
            returns.append(ret)
            lengths.append(length)
            ret, length = 0.0, 0
            env.reset()
    return returns, lengths


def test_per_actor_order_is_preserved_and_nothing_is_dropped():
    n_actors, n_steps, updates = 3, 16, 6
    config = small_config(num_actors=n_actors, n_steps=n_steps,
                          total_timesteps=n_actors * n_steps * updates, broadcast_every=2,
                          max_lead_steps=3 * n_steps, seed=5, ppo=PPOConfig(n_epochs=1,
                                                                             batch_size=48))
    infos = []
    trainer = make_learner(config, CounterEnv)
    group = start_actors(config, CounterEnv, chunk_size=5)        # 5 does not divide 16
    trainer, report = learner_loop(config, trainer, group, callback=infos.append)
    assert report.updates == updates and report.env_steps == n_actors * n_steps * updates
    obs = np.concatenate([i.rollout.observations for i in infos])   # [updates*T, N, 3]
    rewards = np.concatenate([i.rollout.rewards for i in infos])
    consumed = updates * n_steps
    for n in range(n_actors):
        assert np.all(obs[:, n, 0] == config.seed + 1 + n)         # column = agent_id
        np.testing.assert_array_equal(obs[:, n, 1], np.arange(consumed))   # step numbers in order
        np.testing.assert_array_equal(rewards[:, n], np.arange(1, consumed + 1))
    # Episode bookkeeping across buffer boundaries, in consumption order (row by row).
    want_returns, want_lengths = counter_episodes(consumed)
    ends = [(t, n) for n in range(n_actors) for t in range(consumed)]
    per_actor = {n: iter(zip(want_returns, want_lengths)) for n in range(n_actors)}
    done = np.concatenate([i.rollout.terminated | i.rollout.truncated for i in infos])
    expected = [next(per_actor[n]) for t, n in sorted(ends) if done[t, n]]
    assert report.episode_returns == [e[0] for e in expected]
    assert report.episode_lengths == [e[1] for e in expected]
    assert report.episodes == len(expected) == trainer.n_episodes
    # Every actor sent at least what was consumed and at most lead_limit beyond the last
    # consumed-and-proven budget.
    for stats in report.actor_stats:
        assert consumed <= stats.steps_sent <= consumed + config.lead_limit
    # episode_starts continue across buffers: row 0 of each buffer = done on the previous row.
    starts = np.concatenate([i.rollout.episode_starts for i in infos])
    np.testing.assert_array_equal(starts[1:], done[:-1])
    assert starts[0].all()
    lags = np.concatenate([i.version - i.policy_versions for i in infos])
    assert lags.min() >= 0 and report.policy_lag_max == [int(x.max()) for x in
                                                         (i.version - i.policy_versions
                                                          for i in infos)]


# ---------------------------------------------------------------------------------------------
# Failures
# ---------------------------------------------------------------------------------------------

def test_starvation_raises_after_the_timeout():
    config = small_config(starvation_timeout=0.5)
    trainer = make_learner(config, "CartPole-v1")
    group = start_actors(config, "CartPole-v1", actor_fn=silent_actor)
    t0 = time.monotonic()
    with pytest.raises(StarvationError, match="starvation_timeout"):
        learner_loop(config, trainer, group)
    assert 0.5 <= time.monotonic() - t0 < 5.0
    assert no_actor_threads_left()


def test_out_of_range_agent_id_raises_naming_the_field():
    config = small_config()
    trainer = make_learner(config, "CartPole-v1")
    group = start_actors(config, "CartPole-v1", actor_fn=wrong_id_actor)
    with pytest.raises(ExperienceError, match=r"agent_id must be in \[0, 2\), got [23]"):
        learner_loop(config, trainer, group)
    assert no_actor_threads_left()


def test_wrong_observation_shape_raises_naming_the_field():
    config = small_config()
    trainer = make_learner(config, "CartPole-v1")            # learner expects obs of shape (4,)
    group = start_actors(config, "CartPole-v1", actor_fn=wrong_shape_actor)
    with pytest.raises(ExperienceError, match=r"observation must have shape \(4,\), got \(6,\)"):
        learner_loop(config, trainer, group)
    assert no_actor_threads_left()


def test_a_missing_step_is_detected():
    config = small_config()
    trainer = make_learner(config, "CartPole-v1")
    group = start_actors(config, "CartPole-v1", actor_fn=gap_actor)
    with pytest.raises(ExperienceError, match="row 5 is not the next_observation"):
        learner_loop(config, trainer, group)
    assert no_actor_threads_left()


def test_dead_thread_actor_is_reported_with_its_id_and_exception(tmp_path):
    config = small_config(total_timesteps=10 * 64)
    stamp = str(tmp_path / "crash_time")
    env = functools.partial(crashing_env, crash_seed=config.seed + 1 + 1, after=40, how="raise",
                            stamp_path=stamp)
    trainer = make_learner(config, "CartPole-v1")
    with pytest.raises(ActorDiedError, match="RuntimeError: env exploded") as excinfo:
        learner_loop(config, trainer, env)
    assert time.time() - float(open(stamp).read()) < 2.0     # detected, others shut down
    assert excinfo.value.agent_id == 1
    assert "env exploded" in excinfo.value.actor_traceback
    assert no_actor_threads_left()


def test_actor_group_shutdown_is_idempotent_and_collects_stats():
    config = small_config()
    group = start_actors(config, "CartPole-v1")
    assert isinstance(group, ActorGroup) and group.num_actors == 2
    trainer = make_learner(config, "CartPole-v1")
    from ppo_ref.io.checkpoint import arrays_to_bytes
    group.broadcast(PolicyBroadcast(0, arrays_to_bytes(trainer.params)))
    got = 0
    while got < 2 * 64:                     # the default lead lets each actor send 2 * n_steps
        msg = group.get(5.0)
        assert isinstance(msg, ExperienceBatch)
        got += len(msg)
    finals = group.shutdown(5.0)
    assert group.shutdown(5.0) is finals
    assert sorted(finals) == [0, 1]
    for agent_id, msg in finals.items():
        assert msg.stats.agent_id == agent_id and msg.stats.steps_sent == 64
        assert msg.stats.last_policy_version == 0 and msg.stats.broadcasts_received == 1
    assert no_actor_threads_left()


# ---------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------

LEARN_PPO = PPOConfig.zoo_cartpole(n_epochs=10, batch_size=128)
#: The actor-learner learning tests' bar: the mean return of the last 30 episodes (a random
#: CartPole policy averages about 22), reached within 40k env steps.
LEARN_BAR = 150


def until_learned():
    """A :func:`learner_loop` callback that stops the run once the last 30 episodes average
    :data:`LEARN_BAR` (the learning tests then check the report: reached within the budget)."""
    returns = []

    def callback(info):
        returns.extend(info.episode_returns)
        return not (len(returns) >= 30 and np.mean(returns[-30:]) >= LEARN_BAR)
    return callback


@pytest.mark.slow
def test_thread_actors_learn_cartpole():
    config = AsyncActorLearnerConfig(num_actors=2, n_steps=128, total_timesteps=40_000,
                                     gamma=0.98, gae_lambda=0.8, actors="thread", ppo=LEARN_PPO)
    trainer, report = learner_loop(config, make_learner(config, "CartPole-v1"), "CartPole-v1",
                                   callback=until_learned())
    assert report.env_steps <= 50_000
    assert np.mean(report.episode_returns[-30:]) >= LEARN_BAR
    assert max(report.policy_lag_max) >= 1          # the default lead really ran ahead


def test_trainer_with_a_different_discount_is_rejected():
    config = small_config()
    other = make_learner(config.replace(gamma=0.5), "CartPole-v1")
    with pytest.raises(ValueError, match="trainer.config.gamma"):
        learner_loop(config, other, "CartPole-v1")
    assert no_actor_threads_left()


def test_continuous_actions_with_vtrace_and_time_limit_truncation():
    # Pendulum: Gaussian head (raw samples stored, clipped ones sent to the env) and a
    # 200-step time limit, so the second buffer bootstraps a truncation from final_values.
    config = small_config(n_steps=128, total_timesteps=2 * 128 * 2, use_vtrace=True,
                          rho_bar=2.0, ppo=PPOConfig(n_epochs=2, batch_size=64))
    infos = []
    trainer, report = learner_loop(config, make_learner(config, "Pendulum-v1"), "Pendulum-v1",
                                   callback=infos.append)
    assert report.updates == 2 and report.episodes == 2          # one truncation per actor
    last = infos[-1].rollout
    assert last.actions.shape == (128, 2, 1) and last.actions.dtype == np.float64
    assert last.truncated.sum() == 2 and not last.terminated.any()
    assert last.final_values is not None and np.count_nonzero(last.final_values) == 2
    assert np.all(np.isfinite(infos[-1].advantages))
    assert all(np.isfinite(v) for v in report.final_stats.values())


def test_reset_observation_round_trips_and_is_required_where_an_episode_ended(rng):
    exps = [Experience(0, rng.normal(size=4), 1, 1.0, rng.normal(size=4), i == 1, i == 2, 0.0,
                       -0.69, 0, rng.normal(size=4) if i in (1, 2) else None) for i in range(4)]
    batch = ExperienceBatch.from_experiences(exps)
    np.testing.assert_array_equal(batch.reset_observations[[0, 3]],
                                  batch.next_observations[[0, 3]])
    for a, b in zip(exps, batch.experiences()):
        assert (a.reset_observation is None) == (b.reset_observation is None)
        if a.reset_observation is not None:
            np.testing.assert_array_equal(a.reset_observation, b.reset_observation)
    checked = _check_experience_batch(batch, 1, (4,), (), True, 0)
    np.testing.assert_array_equal(checked.reset_observations, batch.reset_observations)
    ended = Experience(0, np.zeros(4), 1, 1.0, np.ones(4), True, False, 0.0, -0.69, 0)
    with pytest.raises(ExperienceError, match="reset_observation is required"):
        _check_experience_batch(ExperienceBatch.from_experiences([ended]), 1, (4,), (), True, 0)
    bad = ended._replace(reset_observation=np.array([0.0, np.nan, 0.0, 0.0]))
    with pytest.raises(ExperienceError, match="reset_observation must be finite"):
        _check_experience_batch(ExperienceBatch.from_experiences([bad]), 1, (4,), (), True, 0)
