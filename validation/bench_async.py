"""Throughput of the actor-learner loop for each actor kind beside the synchronous trainer,
and the cost of moving one experience from an actor to the learner.

On CartPole-v1 with the rl-baselines3-zoo PPO settings (256 rows per update, 20 epochs of one
256-row minibatch, lr 1e-3 and clip 0.2 linearly annealed) it runs:

* ``sync``: :class:`ppo_ref.train.ppo.PPOTrainer` (8 envs x 32 steps per update);
* ``KIND N``: :func:`ppo_ref.distributed.learner_loop` with N = 1, 2, 4, 8 actors of each kind
  (``thread``, ``process``, ``ray``: a local Ray on 127.0.0.1, started once), each update
  taking ``256 / N`` steps from every actor (the same 256-row batch), the default lead
  (``2 * n_steps``) and ``broadcast_every = 1``;

and prints, per run: env steps per second in the steady state (from the end of the first
update to the end of the last, so start-up and numba loading are excluded), wall seconds
including start-up, the mean return of the last 20 episodes, and the policy lag (mean over all
consumed experiences, and the maximum).

Then the transport alone, one actor, no env and no policy: (a) the actor sends
CartPole-shaped :class:`~ppo_ref.distributed.messages.ExperienceBatch` messages of k rows as
fast as it can while the learner only drains them (microseconds per experience from the first
message received to the last, per kind and k: the throughput of the channel); (b) the exchange
of a lockstep run, 32 rows to the learner and a broadcast back, 200 times (the mean round trip
of the second half, in milliseconds, and divided by 32: the cost per experience).

Usage::

    python validation/bench_async.py [--total-timesteps 30000] [--actors 1 2 4 8]
                                     [--kinds thread process ray] [--seed 0]

Only 2 cores here: the learner and the actors share them, so more actors than cores cannot add
throughput; the table shows where the time goes (learner-bound vs actor-bound).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from ppo_ref.config import PPOConfig
from ppo_ref.distributed import (ActorFinished, AsyncActorLearnerConfig, ExperienceBatch,
                                 learner_loop, make_learner, start_actors)
from ppo_ref.train.ppo import PPOTrainer

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


def run_async(kind: str, n_actors: int, total: int, seed: int) -> dict:
    ppo = PPOConfig.zoo_cartpole()
    config = AsyncActorLearnerConfig(num_actors=n_actors, n_steps=256 // n_actors,
                                     total_timesteps=total, gamma=ppo.gamma,
                                     gae_lambda=ppo.gae_lambda, seed=seed, actors=kind,
                                     ppo=ppo, starvation_timeout=300.0)
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
    return {"name": f"{kind} {n_actors} actor{'s' if n_actors > 1 else ''}",
            "fps": (s_last - s_first) / (t_last - t_first), "wall": wall,
            "return20": float(np.mean(report.episode_returns[-20:])), "lag_mean": lag_mean,
            "lag_max": max(report.policy_lag_max), "steps": report.env_steps}


FLOOD_ROWS = 20_000


def flood_actor(agent_id, env, config, send, receive, learner_gone, *, chunk_size):
    """Sends FLOOD_ROWS CartPole-shaped experiences in messages of ``chunk_size`` rows."""
    k = chunk_size
    rng = np.random.default_rng(agent_id)
    obs = rng.normal(size=(k, 4))
    batch = ExperienceBatch(agent_id, obs, np.zeros(k, np.int64), np.ones(k), obs,
                            np.zeros(k, bool), np.zeros(k, bool), np.zeros(k), np.zeros(k),
                            np.zeros(k, np.int64), None)
    for _ in range(FLOOD_ROWS // k):
        send(batch)


def run_transport(kind: str, chunk: int) -> float:
    """Microseconds per experience through the actor kind's channel (first to last message)."""
    config = AsyncActorLearnerConfig(num_actors=1, n_steps=256, actors=kind)
    group = start_actors(config, ENV_ID, actor_fn=flood_actor, chunk_size=chunk)
    rows, first = 0, None
    try:
        while True:
            msg = group.get(1.0)
            if isinstance(msg, ExperienceBatch):
                if first is None:
                    first, first_rows = time.perf_counter(), len(msg)
                rows += len(msg)
            elif isinstance(msg, ActorFinished):
                break
            elif msg is not None:
                raise RuntimeError(f"flood actor: {msg}")
        last = time.perf_counter()
    finally:
        group.shutdown(2.0)
    assert rows == FLOOD_ROWS // chunk * chunk
    return (last - first) / (rows - first_rows) * 1e6


ROUND_TRIPS = 200


def ping_actor(agent_id, env, config, send, receive, learner_gone, *, chunk_size):
    """Sends a message of ``chunk_size`` CartPole-shaped rows, waits for the learner's answer,
    ROUND_TRIPS times (the exchange of a lockstep run: rows, then a broadcast)."""
    k = chunk_size
    obs = np.zeros((k, 4))
    batch = ExperienceBatch(agent_id, obs, np.zeros(k, np.int64), np.ones(k), obs,
                            np.zeros(k, bool), np.zeros(k, bool), np.zeros(k), np.zeros(k),
                            np.zeros(k, np.int64), None)
    for _ in range(ROUND_TRIPS):
        send(batch)
        while receive(1.0) is None:
            pass


def run_round_trip(kind: str, chunk: int) -> float:
    """Milliseconds of one exchange (rows to the learner, a broadcast back), after a warm-up."""
    from ppo_ref.distributed import PolicyBroadcast
    config = AsyncActorLearnerConfig(num_actors=1, n_steps=256, actors=kind)
    group = start_actors(config, ENV_ID, actor_fn=ping_actor, chunk_size=chunk)
    times = []
    try:
        while len(times) < ROUND_TRIPS:
            msg = group.get(1.0)
            if isinstance(msg, ExperienceBatch):
                times.append(time.perf_counter())
                group.broadcast(PolicyBroadcast(len(times), b""))
            elif msg is not None:
                raise RuntimeError(f"ping actor: {msg}")
    finally:
        group.shutdown(2.0)
    half = ROUND_TRIPS // 2                      # the second half: warmed up
    return (times[-1] - times[half]) / (ROUND_TRIPS - 1 - half) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-timesteps", type=int, default=30_000)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--kinds", nargs="+", default=["thread", "process", "ray"],
                        choices=["thread", "process", "ray"])
    parser.add_argument("--transport-chunks", type=int, nargs="*", default=[1, 32, 256],
                        help="rows per message of the transport table (none: skip it)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if "ray" in args.kinds:
        from ppo_ref.distributed.ray_actors import init_ray
        init_ray(num_cpus=max(args.actors))      # once: its start-up is not a learner's cost
    results = [run_sync(args.total_timesteps, args.seed)]
    for kind in args.kinds:
        for n in args.actors:
            results.append(run_async(kind, n, args.total_timesteps, args.seed))
    transport = {(kind, chunk): run_transport(kind, chunk)
                 for kind in args.kinds for chunk in args.transport_chunks}
    round_trip = {kind: run_round_trip(kind, 32) for kind in args.kinds}
    import subprocess
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True,
                         text=True).stdout.split(":")[-1].strip()
    print(f"\nCPU: {cpu}, {os.cpu_count()} logical CPUs, load average at the end "
          f"{os.getloadavg()[0]:.1f}")
    print(f"CartPole-v1, zoo PPO settings, {args.total_timesteps} steps, seed {args.seed}")
    print(f"| run | env steps/s (steady) | wall s (incl. start-up) | steps | return (last 20) "
          f"| policy lag mean | policy lag max |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['name']} | {r['fps']:.0f} | {r['wall']:.1f} | {r['steps']} | "
              f"{r['return20']:.1f} | {r['lag_mean']:.2f} | {r['lag_max']} |")
    if transport:
        chunks = args.transport_chunks
        print(f"\nTransport: microseconds per experience, one actor, {FLOOD_ROWS} experiences")
        print("| actors | " + " | ".join(f"{k} row{'s' if k > 1 else ''} per message"
                                         for k in chunks) + " |")
        print("|---|" + "---:|" * len(chunks))
        for kind in args.kinds:
            print(f"| {kind} | " + " | ".join(f"{transport[kind, k]:.1f}" for k in chunks)
                  + " |")
    print(f"\nRound trip (32 rows to the learner, a broadcast back; the last "
          f"{ROUND_TRIPS // 2}, mean ms) and its cost per experience (us)")
    print("| actors | round trip ms | us per experience |")
    print("|---|---:|---:|")
    for kind in args.kinds:
        print(f"| {kind} | {round_trip[kind]:.2f} | {round_trip[kind] * 1e3 / 32:.1f} |")


if __name__ == "__main__":
    main()
