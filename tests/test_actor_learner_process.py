"""Actor-learner loop with process actors (multiprocessing, spawn): failures and learning.

Each test starts fresh actor processes (each imports numpy, numba, gymnasium), so they are few.
"""
import functools
import multiprocessing
import time

import numpy as np
import pytest

from ppo_ref.distributed import (ActorDiedError, AsyncActorLearnerConfig, learner_loop,
                                   make_learner)
from ppo_ref.config import PPOConfig

from test_actor_learner import LEARN_BAR, LEARN_PPO, crashing_env, until_learned


def process_config(**changes):
    base = dict(num_actors=2, n_steps=32, total_timesteps=20 * 64, actors="process",
                ppo=PPOConfig(n_epochs=1, batch_size=64), starvation_timeout=60.0)
    base.update(changes)
    return AsyncActorLearnerConfig(**base)


@pytest.mark.parametrize("how, text", [
    ("raise", "RuntimeError: env exploded"),               # the actor's exception, reported
    ("exit", "exited with code 3 without reporting"),      # silent death, found by liveness
])
def test_dead_actor_process_is_reported_and_nothing_is_left_running(how, text, tmp_path):
    config = process_config()
    stamp = str(tmp_path / "crash_time")
    env = functools.partial(crashing_env, crash_seed=config.seed + 1 + 1, after=50, how=how,
                            stamp_path=stamp)
    trainer = make_learner(config, "CartPole-v1")
    with pytest.raises(ActorDiedError, match=text) as excinfo:
        learner_loop(config, trainer, env)
    # Detected and every other actor shut down within ~2 s of the crash (wall clock of the
    # crash written by the dying actor).
    assert time.time() - float(open(stamp).read()) < 3.0
    assert excinfo.value.agent_id == 1
    assert multiprocessing.active_children() == []          # no orphaned actor process


@pytest.mark.slow
def test_process_actors_learn_cartpole():
    config = AsyncActorLearnerConfig(num_actors=2, n_steps=128, total_timesteps=40_000,
                                     gamma=0.98, gae_lambda=0.8, actors="process", ppo=LEARN_PPO)
    trainer, report = learner_loop(config, make_learner(config, "CartPole-v1"), "CartPole-v1",
                                   callback=until_learned())
    assert report.env_steps <= 50_000
    assert np.mean(report.episode_returns[-30:]) >= LEARN_BAR
    assert all(s is not None and s.steps_sent >= report.env_steps // 2
               for s in report.actor_stats)
    assert multiprocessing.active_children() == []


def test_lockstep_runs_are_identical_with_thread_and_process_actors():
    # Lockstep: each actor's steps and the version it acts with are fixed by the seeds alone,
    # not by timing, so thread and process runs must end with bit-identical parameters.
    results = []
    for kind in ("thread", "process"):
        config = process_config(actors=kind, max_lead_steps=32, total_timesteps=5 * 64,
                                seed=3)
        trainer, report = learner_loop(config, make_learner(config, "CartPole-v1"),
                                       "CartPole-v1")
        assert report.policy_lag_max == [0] * 5
        results.append((trainer.params, report.episode_returns))
    (p_thread, r_thread), (p_process, r_process) = results
    assert r_thread == r_process
    assert p_thread.keys() == p_process.keys()
    for key in p_thread:
        np.testing.assert_array_equal(p_thread[key], p_process[key])
    assert multiprocessing.active_children() == []
