"""Learning curves: ppo_ref vs Stable-Baselines3 on CartPole-v1, and ppo_ref's LSTM trainer vs
sb3-contrib's RecurrentPPO on ppo_ref/CartPoleNoVel-v1 (velocity-masked CartPole), with the same
settings and seeds.

Settings (both implementations, both tasks): rl-baselines3-zoo's CartPole PPO settings
(``PPOConfig.zoo_cartpole()``: 8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, lambda
0.8, learning rate 1e-3 and clip range 0.2 both linearly annealed, ent_coef 0), SB3
conventions (``preset("sb3")``-equivalent fields), tanh, separate actor/critic towers. MLP:
``net_arch=(64, 64)``. LSTM: one LSTM of 64 units per tower (sb3-contrib
``enable_critic_lstm=True``), then ``net_arch=(64,)``; both trainers put the 256 rows of a
rollout in one minibatch (ppo_ref: all 8 envs; sb3-contrib: its padded sequences).

Metric: after every PPO update, the mean return of the last 100 finished *training* episodes
(ppo_ref ``trainer.recent_returns``; SB3 ``model.ep_info_buffer``, the Monitor's last 100), at
the number of environment steps so far. "final return" is that value at the end of the run.
Steps per second = total environment steps / wall-clock time of ``learn`` (collection + updates,
single process, the machine's other load included).

Outputs in ``--out`` (default ``./learning_curves``): ``learning_curves.png`` (one panel per
task, mean over seeds with min-max band), ``learning_curves.json`` (every curve) and
``learning_curves.md`` (the table, also printed).

Run: ``python validation/learning_curves.py`` (full: 100k steps, 3 seeds, several minutes to
hours depending on the machine) or ``python validation/learning_curves.py --quick`` (a short
smoke run: a few thousand steps per run; checks that everything runs and the curves are
written, not that the agents learn).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

TASKS = {
    "mlp": {"env_id": "CartPole-v1", "title": "CartPole-v1: ppo_ref vs SB3 PPO"},
    "lstm": {"env_id": "ppo_ref/CartPoleNoVel-v1",
             "title": "CartPoleNoVel-v1: ppo_ref LSTM vs sb3-contrib RecurrentPPO"},
}


def make_config(task: str):
    """The shared settings as a PPOConfig (the SB3 implementation receives the same numbers)."""
    from ppo_ref.config import PPOConfig
    base = PPOConfig.zoo_cartpole()
    sb3_conventions = PPOConfig.preset("sb3")
    conv = {f: getattr(sb3_conventions, f) for f in
            ("truncation", "value_loss_mode", "value_loss_scale", "clip_range_vf",
             "advantage_norm_scope", "advantage_norm_ddof", "kl_estimator", "kl_stop_rule",
             "schedule_progress")}
    if task == "mlp":
        return base.replace(net_arch=(64, 64), **conv)
    return base.replace(net_arch=(64,), lstm_hidden_size=64, lstm_shared=False, **conv)


def run_ppo_ref(task: str, seed: int, total_timesteps: int) -> dict:
    import ppo_ref.envs  # noqa: F401  (registers ppo_ref/CartPoleNoVel-v1)
    config = make_config(task)
    if task == "mlp":
        from ppo_ref import PPOTrainer as Trainer
    else:
        from ppo_ref import RecurrentPPOTrainer as Trainer
    trainer = Trainer(TASKS[task]["env_id"], config, seed=seed)
    steps, returns = [], []

    def callback(tr, stats):
        if tr.recent_returns:
            steps.append(int(tr.num_timesteps))
            returns.append(float(np.mean(tr.recent_returns)))

    t0 = time.perf_counter()
    trainer.learn(total_timesteps, callback=callback)
    elapsed = time.perf_counter() - t0
    n = int(trainer.num_timesteps)
    trainer.close()
    return {"steps": steps, "returns": returns, "timesteps": n, "seconds": elapsed}


def run_sb3(task: str, seed: int, total_timesteps: int) -> dict:
    import torch as th
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    import ppo_ref.envs  # noqa: F401

    c = make_config(task)
    lr0, clip0 = c.learning_rate, c.clip_range
    common = dict(learning_rate=lambda p: lr0 * p, n_steps=c.n_steps, batch_size=c.batch_size,
                  n_epochs=c.n_epochs, gamma=c.gamma, gae_lambda=c.gae_lambda,
                  clip_range=lambda p: clip0 * p, ent_coef=c.ent_coef, vf_coef=c.vf_coef,
                  max_grad_norm=c.max_grad_norm, seed=seed, device="cpu", verbose=0)
    env = make_vec_env(TASKS[task]["env_id"], n_envs=c.n_envs, seed=seed)
    if task == "mlp":
        from stable_baselines3 import PPO
        model = PPO("MlpPolicy", env, policy_kwargs=dict(
            net_arch=dict(pi=list(c.net_arch), vf=list(c.net_arch)), activation_fn=th.nn.Tanh),
            **common)
    else:
        from sb3_contrib import RecurrentPPO
        model = RecurrentPPO("MlpLstmPolicy", env, policy_kwargs=dict(
            net_arch=dict(pi=list(c.net_arch), vf=list(c.net_arch)), activation_fn=th.nn.Tanh,
            lstm_hidden_size=c.lstm_hidden_size, enable_critic_lstm=True, shared_lstm=False),
            **common)
    steps, returns = [], []

    class Record(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            buf = self.model.ep_info_buffer
            if buf:
                steps.append(int(self.model.num_timesteps))
                returns.append(float(np.mean([ep["r"] for ep in buf])))

    th.set_num_threads(1)
    t0 = time.perf_counter()
    model.learn(total_timesteps, callback=Record())
    elapsed = time.perf_counter() - t0
    n = int(model.num_timesteps)
    env.close()
    return {"steps": steps, "returns": returns, "timesteps": n, "seconds": elapsed}


IMPLEMENTATIONS = {
    "mlp": (("ppo_ref", run_ppo_ref), ("SB3", run_sb3)),
    "lstm": (("ppo_ref LSTM", run_ppo_ref), ("sb3-contrib", run_sb3)),
}


def table(results: dict) -> str:
    lines = ["| task | implementation | seeds | final return (mean +- std over seeds) | "
             "per seed | steps/s (mean) | steps per run |",
             "|---|---|---|---|---|---|---|"]
    for task, impls in results.items():
        for name, runs in impls.items():
            finals = [r["returns"][-1] if r["returns"] else float("nan") for r in runs]
            sps = [r["timesteps"] / r["seconds"] for r in runs]
            lines.append(f"| {TASKS[task]['env_id']} | {name} | {len(runs)} | "
                         f"{np.mean(finals):.1f} +- {np.std(finals):.1f} | "
                         f"{', '.join(f'{x:.1f}' for x in finals)} | {np.mean(sps):.0f} | "
                         f"{runs[0]['timesteps']} |")
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (task, impls) in zip(axes[0], results.items()):
        for name, runs in impls.items():
            if not all(r["steps"] for r in runs):
                continue
            # common range of all seeds (no extrapolation before the first recorded update)
            grid = np.linspace(max(r["steps"][0] for r in runs),
                               min(r["steps"][-1] for r in runs), 100)
            curves = np.array([np.interp(grid, r["steps"], r["returns"]) for r in runs])
            line, = ax.plot(grid, curves.mean(axis=0), label=f"{name} ({len(runs)} seeds)")
            ax.fill_between(grid, curves.min(axis=0), curves.max(axis=0),
                            color=line.get_color(), alpha=0.2)
        ax.set_title(TASKS[task]["title"], fontsize=10)
        ax.set_xlabel("environment steps")
        ax.set_ylabel("mean training return (last 100 episodes)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 4096 steps per run (default 100000)")
    parser.add_argument("--timesteps", type=int, default=None, help="steps per run (override)")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (0 .. n-1)")
    parser.add_argument("--tasks", default="mlp,lstm", help="comma list of: mlp, lstm")
    parser.add_argument("--out", default="learning_curves", help="output directory")
    args = parser.parse_args(argv)
    total = args.timesteps or (4096 if args.quick else 100_000)
    os.makedirs(args.out, exist_ok=True)
    results: dict = {}
    for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        if task not in TASKS:
            raise SystemExit(f"--tasks: unknown task {task!r} (choose from {list(TASKS)})")
        results[task] = {}
        for name, fn in IMPLEMENTATIONS[task]:
            runs = []
            for seed in range(args.seeds):
                r = fn(task, seed, total)
                print(f"{TASKS[task]['env_id']:<26} {name:<13} seed {seed}: "
                      f"final {r['returns'][-1] if r['returns'] else float('nan'):7.1f}  "
                      f"{r['timesteps'] / r['seconds']:7.0f} steps/s", flush=True)
                runs.append(r)
            results[task][name] = runs
    md = table(results)
    print()
    print(md)
    with open(os.path.join(args.out, "learning_curves.md"), "w", encoding="utf-8") as fh:
        fh.write(f"Steps per run: {total}; seeds: {args.seeds}\n\n{md}\n")
    with open(os.path.join(args.out, "learning_curves.json"), "w", encoding="utf-8") as fh:
        json.dump({"timesteps_per_run": total, "results": results}, fh)
    plot(results, os.path.join(args.out, "learning_curves.png"))
    print(f"\nwrote {args.out}/learning_curves.png, .md, .json")
    return results


if __name__ == "__main__":
    main()
