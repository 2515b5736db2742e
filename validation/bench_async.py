"""Throughput of the actor-learner loop (process backend) beside the synchronous trainer.

On CartPole-v1 with the rl-baselines3-zoo PPO settings (256 rows per update, 20 epochs of one
256-row minibatch, lr 1e-3 and clip 0.2 linearly annealed) it runs:

* ``sync``: :class:`ppo_ref.ppo.PPOTrainer` (8 envs x 32 steps per update);
* ``async N``: :func:`ppo_ref.actor_learner.learner_loop` with N = 1, 2, 4 actor processes, each
  update taking ``256 / N`` steps from every actor (the same 256-row batch), the default lead
  (``2 * n_steps``) and ``broadcast_every = 1``;

and prints, per run: env steps per second in the steady state (from the end of the first
update to the end of the last, so process start-up and numba loading are excluded), wall
seconds including start-up, the mean return of the last 20 episodes, and the policy lag (mean
over all consumed experiences, and the maximum).

Usage::

    python validation/bench_async.py [--total-timesteps 30000] [--actors 1 2 4] [--seed 0]

Only 2 cores: the learner and the actors share them, so more actors than cores cannot add
throughput; the table shows where the time goes (learner-bound vs actor-bound).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ppo_ref.actor_learner import AsyncActorLearnerConfig, learner_loop, make_learner
from ppo_ref.config import PPOConfig
from ppo_ref.ppo import PPOTrainer

ENV_ID = "CartPole-v1"


def run_sync(total: int, seed: int) -> dict:
    t0 = time.perf_counter()
    trainer = PPOTrainer(ENV_ID, PPOConfig.zoo_cartpole(), seed=seed)
    marks = []

    def callback(tr, stats):
        marks.append((time.perf_counter(), tr.num_timesteps))

    trainer.learn(total, callback=callback)
    wall = time.perf_counter() - t0
    trainer.close()
    (t_first, s_first), (t_last, s_last) = marks[0], marks[-1]
    return {"name": "sync (8 envs)", "fps": (s_last - s_first) / (t_last - t_first),
            "wall": wall, "return20": float(np.mean(list(trainer.recent_returns)[-20:])),
            "lag_mean": 0.0, "lag_max": 0, "steps": trainer.num_timesteps}


def run_async(n_actors: int, total: int, seed: int) -> dict:
    ppo = PPOConfig.zoo_cartpole()
    config = AsyncActorLearnerConfig(num_actors=n_actors, n_steps=256 // n_actors,
                                     total_timesteps=total, gamma=ppo.gamma,
                                     gae_lambda=ppo.gae_lambda, seed=seed, actors="process",
                                     ppo=ppo)
    t0 = time.perf_counter()
    trainer = make_learner(config, ENV_ID)
    marks = []
    trainer, report = learner_loop(config, trainer, ENV_ID,
                                   callback=lambda info: marks.append((time.perf_counter(),
                                                                       info.env_steps)))
    wall = time.perf_counter() - t0
    trainer.close()
    (t_first, s_first), (t_last, s_last) = marks[0], marks[-1]
    rows = config.n_steps * n_actors
    lag_mean = float(np.sum(np.array(report.policy_lag_mean) * rows) / (rows * report.updates))
    return {"name": f"async {n_actors} actor{'s' if n_actors > 1 else ''}",
            "fps": (s_last - s_first) / (t_last - t_first), "wall": wall,
            "return20": float(np.mean(report.episode_returns[-20:])), "lag_mean": lag_mean,
            "lag_max": max(report.policy_lag_max), "steps": report.env_steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-timesteps", type=int, default=30_000)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    results = [run_sync(args.total_timesteps, args.seed)]
    for n in args.actors:
        results.append(run_async(n, args.total_timesteps, args.seed))
    print(f"\nCartPole-v1, zoo PPO settings, {args.total_timesteps} steps, seed {args.seed}")
    print(f"| run | env steps/s (steady) | wall s (incl. start-up) | steps | return (last 20) "
          f"| policy lag mean | policy lag max |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['name']} | {r['fps']:.0f} | {r['wall']:.1f} | {r['steps']} | "
              f"{r['return20']:.1f} | {r['lag_mean']:.2f} | {r['lag_max']} |")


if __name__ == "__main__":
    main()
