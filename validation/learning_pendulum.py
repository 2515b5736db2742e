"""Pendulum-v1 learning curves: ppo_ref vs Stable-Baselines3 PPO with the same settings.

Settings: rl-baselines3-zoo's Pendulum-v1 PPO entry (4 envs, n_steps 1024, batch_size 64 (SB3
default), n_epochs 10, gamma 0.9, gae_lambda 0.95, learning rate 1e-3, clip range 0.2,
ent_coef 0, observation and reward normalization with gamma 0.9) without gSDE (``use_sde``),
which ppo_ref does not implement: both use the plain diagonal Gaussian with a
state-independent log std. 100k steps, seeds 0 (``--seeds``), torch on one thread.

Writes ``pendulum_learning_curve.png`` (``--output``) and prints a table of the mean return of
the episodes finished in each 10k-step window.

Usage::

    python validation/learning_pendulum.py [--timesteps 100000] [--seeds 0 1] [--output PNG]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

SETTINGS = dict(n_envs=4, n_steps=1024, batch_size=64, n_epochs=10, gamma=0.9, gae_lambda=0.95,
                learning_rate=1e-3, clip_range=0.2, ent_coef=0.0)


def run_ppo_ref(timesteps: int, seed: int):
    from ppo_ref.config import PPOConfig
    from ppo_ref import PPOTrainer
    cfg = PPOConfig(normalize_observations=True, normalize_rewards=True, **SETTINGS)
    trainer = PPOTrainer("Pendulum-v1", cfg, seed=seed)
    curve = []

    def cb(t, stats):
        curve.extend((t.num_timesteps, float(ret)) for _, ret, _ in t.last_episodes)
    t0 = time.perf_counter()
    trainer.learn(timesteps, cb)
    wall = time.perf_counter() - t0
    trainer.close()
    return np.array(curve), wall


def run_sb3(timesteps: int, seed: int):
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    torch.set_num_threads(1)
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=SETTINGS["n_envs"], seed=seed),
                       gamma=SETTINGS["gamma"])
    curve = []

    class Record(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    curve.append((self.num_timesteps, float(info["episode"]["r"])))
            return True
    kw = {k: v for k, v in SETTINGS.items() if k != "n_envs"}
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kw)
    t0 = time.perf_counter()
    model.learn(timesteps, callback=Record())
    wall = time.perf_counter() - t0
    env.close()
    return np.array(curve), wall


def window_means(curve: np.ndarray, timesteps: int, width: int = 10_000):
    edges = np.arange(0, timesteps + width, width)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (curve[:, 0] > lo) & (curve[:, 0] <= hi)
        out.append(float(curve[sel, 1].mean()) if sel.any() else float("nan"))
    return edges[1:], out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timesteps", type=int, default=100_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--output", default="pendulum_learning_curve.png")
    args = p.parse_args(argv)
    results = {}
    for name, fn in (("ppo_ref", run_ppo_ref), ("sb3", run_sb3)):
        for seed in args.seeds:
            curve, wall = fn(args.timesteps, seed)
            results[(name, seed)] = (curve, wall)
            print(f"{name} seed {seed}: {len(curve)} episodes, {wall:.1f} s", flush=True)
    print()
    header = f"{'steps':>8s} " + " ".join(f"{n + ' s' + str(s):>14s}" for n, s in results)
    print("mean episode return per 10k-step window (Pendulum-v1, zoo settings without gSDE)")
    print(header)
    columns = {key: window_means(curve, args.timesteps)[1] for key, (curve, _) in results.items()}
    ends = window_means(next(iter(results.values()))[0], args.timesteps)[0]
    for i, end in enumerate(ends):
        print(f"{end:8d} " + " ".join(f"{columns[key][i]:14.1f}" for key in results))
    print("wall seconds: " + ", ".join(f"{n} s{s}: {w:.1f}" for (n, s), (_, w) in results.items()))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG written", file=sys.stderr)
        return 0
    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, seed), (curve, _) in results.items():
        r = curve[:, 1]
        smooth = np.array([r[max(0, i - 19):i + 1].mean() for i in range(len(r))])
        ax.plot(curve[:, 0], smooth, label=f"{name} seed {seed}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return (mean of last 20)")
    ax.set_title("Pendulum-v1, rl-zoo PPO settings (no gSDE)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
