"""Speed and result of ppo_ref vs Stable-Baselines3 PPO on CartPole-v1 with the rl-zoo settings.

Both train 100k steps with 8 envs, n_steps 32, batch_size 256, n_epochs 20, gamma 0.98,
gae_lambda 0.8, learning rate 1e-3 and clip range 0.2 linearly annealed, ent_coef 0, seed 0,
torch on ``--torch-threads`` threads (default 1: ``torch.set_num_threads``), ppo_ref's numba
kernels on ``--threads`` (default ``NUMBA_NUM_THREADS``, one per CPU; the trainer's
``threads``: the two towers of a pass and the Adam step's entries run on them, the same bits for
every number; a quiet machine is assumed, as for every timing here), BLAS limited to one thread (ppo_ref's passes do not call it).
Printed per implementation: the arithmetic (ppo_ref's ``PPOConfig.compute_dtype``; SB3 is
torch float32), wall seconds, env steps per second, mean return of the last 20 training
episodes, deterministic evaluation return (10 episodes), and the speed ratio to SB3.

ppo_ref runs once per ``--dtypes`` entry: ``float64`` is the trainer's default (the reference
arithmetic), ``float32`` computes the network passes in float32 as torch does (parameters,
Adam, losses and advantages stay float64). ppo_ref is also run once in a fresh subprocess with
an empty ``NUMBA_CACHE_DIR`` (with the last of ``--dtypes``): the "first run" time includes
importing and compiling every numba kernel. The readable tier (``PPOConfig.backend="spec"``,
float64, plain NumPy) is run once per repeat on ``--spec-timesteps`` steps (default 10000; 0
skips it): its steps per second stand beside the others (its returns are those of that shorter
run, not comparable with the 100k-step rows).

``--repeats N`` (default 1) runs the whole set N times, alternating the implementations (all
of them once, then all again, ...), and prints each run's steps per second and ratio, then a
table of the medians (wall seconds, steps per second, ratio of the median steps per second):
on a shared machine a single pair of runs can be off by +-10% in either direction.

``--vectorization envpool`` steps ppo_ref's envs with envpool (the SB3 run keeps its
``DummyVecEnv``).

Usage::

    python validation/bench_vs_sb3.py [--timesteps 100000] [--dtypes float64,float32]
                                      [--skip-first-run] [--skip-sb3] [--repeats 1]
                                      [--spec-timesteps 10000] [--threads N]
                                      [--torch-threads 1] [--vectorization sync]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench_threads import add_thread_options, apply_thread_options

ZOO = dict(n_envs=8, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8,
           learning_rate=1e-3, clip_range=0.2, ent_coef=0.0)


def run_ppo_ref(timesteps: int, seed: int = 0, compute_dtype: str = "float64",
                backend: str = "fast", threads: int = 1, vectorization: str = "sync"):
    from ppo_ref.config import PPOConfig
    from ppo_ref import PPOTrainer
    config = PPOConfig.zoo_cartpole(compute_dtype=compute_dtype, backend=backend)
    trainer = PPOTrainer("CartPole-v1", config, seed=seed, threads=threads,
                         vectorization=vectorization)
    t0 = time.perf_counter()
    trainer.learn(timesteps)
    wall = time.perf_counter() - t0
    last20 = float(np.mean(list(trainer.recent_returns)[-20:]))
    eval_returns = trainer.evaluate(10, deterministic=True, seed=1000)
    trainer.close()
    return {"wall_s": wall, "steps_per_s": trainer.num_timesteps / wall, "last20": last20,
            "eval": float(np.mean(eval_returns)), "steps": trainer.num_timesteps}


def run_sb3(timesteps: int, seed: int = 0, threads: int = 1):
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    torch.set_num_threads(threads)

    def linear(initial):
        return lambda progress_remaining: initial * progress_remaining
    env = make_vec_env("CartPole-v1", n_envs=ZOO["n_envs"], seed=seed)
    model = PPO("MlpPolicy", env, n_steps=ZOO["n_steps"], batch_size=ZOO["batch_size"],
                n_epochs=ZOO["n_epochs"], gamma=ZOO["gamma"], gae_lambda=ZOO["gae_lambda"],
                learning_rate=linear(ZOO["learning_rate"]), clip_range=linear(ZOO["clip_range"]),
                ent_coef=ZOO["ent_coef"], seed=seed, device="cpu", verbose=0)
    t0 = time.perf_counter()
    model.learn(timesteps)
    wall = time.perf_counter() - t0
    last20 = float(np.mean([ep["r"] for ep in list(model.ep_info_buffer)[-20:]]))
    import gymnasium as gym
    from stable_baselines3.common.monitor import Monitor
    eval_env = Monitor(gym.make("CartPole-v1"))
    eval_env.reset(seed=1000)
    mean_eval, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)
    env.close()
    return {"wall_s": wall, "steps_per_s": model.num_timesteps / wall, "last20": last20,
            "eval": float(mean_eval), "steps": model.num_timesteps}


FIRST_RUN_CODE = """
import time
t0 = time.perf_counter()
from ppo_ref.config import PPOConfig
from ppo_ref import PPOTrainer
t_import = time.perf_counter() - t0
tr = PPOTrainer("CartPole-v1", PPOConfig.zoo_cartpole(compute_dtype="{dtype}"), seed=0,
                threads={threads})
tr.learn({timesteps})
print(t_import, time.perf_counter() - t0)
"""


def first_run_time(timesteps: int, dtype: str, threads: int):
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, NUMBA_NUM_THREADS=str(threads))
        t0 = time.perf_counter()
        code = FIRST_RUN_CODE.format(timesteps=timesteps, dtype=dtype, threads=threads)
        out = subprocess.run([sys.executable, "-c", code],
                             env=env, capture_output=True, text=True, check=True)
        process_wall = time.perf_counter() - t0
    t_import, t_total = (float(x) for x in out.stdout.split())
    return {"process_wall_s": process_wall, "import_s": t_import, "import_and_train_s": t_total}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timesteps", type=int, default=100_000)
    p.add_argument("--dtypes", default="float64,float32",
                   help="comma-separated PPOConfig.compute_dtype values to run ppo_ref with")
    p.add_argument("--skip-first-run", action="store_true")
    p.add_argument("--skip-sb3", action="store_true")
    p.add_argument("--spec-timesteps", type=int, default=10_000,
                   help="steps of the spec-backend (readable tier) run; 0 skips it")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every implementation this many times (alternating); print medians")
    p.add_argument("--vectorization", default="sync", choices=["sync", "envpool"],
                   help="how ppo_ref steps its 8 envs: gymnasium's SyncVectorEnv or envpool")
    add_thread_options(p, "SB3")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    apply_thread_options(p, args)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    runs = []  # one {(name, dtype): result} per repeat
    if not args.skip_first_run:
        first = first_run_time(args.timesteps, dtypes[-1], args.threads)
        print(f"ppo_ref first run ({dtypes[-1]}, empty NUMBA_CACHE_DIR, fresh process): "
              f"{first['process_wall_s']:.1f} s wall for the process "
              f"(imports {first['import_s']:.1f} s, imports + compile + train "
              f"{first['import_and_train_s']:.1f} s)", flush=True)
    for repeat in range(args.repeats):
        rows = {}
        for dtype in dtypes:
            rows[("ppo_ref", dtype)] = run_ppo_ref(args.timesteps, compute_dtype=dtype,
                                                   threads=args.threads,
                                                   vectorization=args.vectorization)
        if args.spec_timesteps > 0:
            rows[("ppo_ref spec", "float64")] = run_ppo_ref(args.spec_timesteps, backend="spec",
                                                            threads=args.threads)
        if not args.skip_sb3:
            rows[("sb3", "float32")] = run_sb3(args.timesteps, threads=args.torch_threads)
        runs.append(rows)
        if args.repeats > 1:
            sb3 = rows.get(("sb3", "float32"))
            print(f"run {repeat + 1}: " + ", ".join(
                f"{name} {dtype} {r['steps_per_s']:.0f} steps/s"
                + (f" ({r['steps_per_s'] / sb3['steps_per_s']:.2f}x)" if sb3 else "")
                for (name, dtype), r in rows.items()), flush=True)
    rows = runs[0]
    if args.repeats > 1:  # medians over the repeats; the returns are those of every run (same seed)
        rows = {key: {"wall_s": float(np.median([run[key]["wall_s"] for run in runs])),
                      "steps_per_s": float(np.median([run[key]["steps_per_s"] for run in runs])),
                      "last20": float(np.median([run[key]["last20"] for run in runs])),
                      "eval": float(np.median([run[key]["eval"] for run in runs])),
                      "steps": runs[0][key]["steps"]}
                for key in runs[0]}
    print()
    print(f"CartPole-v1, rl-zoo settings, {args.timesteps} steps, seed 0, threads: ppo_ref "
          f"numba {args.threads}, torch {args.torch_threads}, OpenBLAS 1"
          + (f", medians of {args.repeats} alternated runs" if args.repeats > 1 else ""))
    print(f"{'':12s} {'dtype':>8s} {'steps':>7s} {'wall s':>8s} {'steps/s':>9s} "
          f"{'last-20 return':>15s} {'det. eval (10)':>15s} {'vs sb3':>7s}")
    sb3 = rows.get(("sb3", "float32"))
    for (name, dtype), r in rows.items():
        ratio = f"{r['steps_per_s'] / sb3['steps_per_s']:6.2f}x" if sb3 else ""
        print(f"{name:12s} {dtype:>8s} {r['steps']:7d} {r['wall_s']:8.1f} {r['steps_per_s']:9.0f} "
              f"{r['last20']:15.1f} {r['eval']:15.1f} {ratio:>7s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
