"""ppo_ref's LSTM PPO against sb3-contrib's RecurrentPPO on ppo_ref/CartPoleNoVel-v1, one run.

Both learners get rl-baselines3-zoo's ``ppo_lstm`` settings for CartPoleNoVel-v1: 8 envs,
n_steps 32, batch 256 (sb3-contrib: 256 rows = all 8 env-sequences; ppo_ref: 8 envs per
env-minibatch, i.e. one minibatch of whole envs), n_epochs 20, gamma 0.98, gae_lambda 0.8,
learning rate 1e-3 and clip range 0.2 both linearly annealed, ent_coef 0, LSTM of 64 units with
a separate critic LSTM, towers ``pi=[64], vf=[64]`` with ReLU, observations normalized by a
running mean/std (zoo ``normalize: {norm_obs: True, norm_reward: False}``), 100k steps.
Differences that remain: sb3-contrib's zoo run uses torch's default init (``ortho_init=False``),
ppo_ref orthogonal init (docs/specification.md §3); sb3-contrib splits sequences at episode starts and pads
them, ppo_ref replays each env's whole rollout from its stored start state (docs/specification.md §5); the
numerical results are the same algorithm, not the same numbers.

ppo_ref runs once per ``--dtypes`` entry (default ``float64,float32``): ``float64`` is the
trainer's default and the reference arithmetic; ``float32`` (``PPOConfig.compute_dtype``) runs
the LSTMs, towers and heads in float32 as torch does (parameters, Adam, losses and advantages
stay float64).

Printed per learner (and dtype): wall seconds (training only, after a warm-up that compiles
numba kernels for ppo_ref; with sb3-contrib run, ppo_ref is timed before and again after it,
the same seed replaying the same run, and its wall is the mean of the two: the shared VM's
speed drifts by tens of percent over minutes, and sb3-contrib's run takes minutes, so a single
ppo_ref run before it can land in another phase; ``--no-bracket`` skips the second run), env
steps per second, mean return of the last 20 training episodes, and a deterministic evaluation
(20 episodes, frozen observation statistics, seed 0); then the speed ratio of each ppo_ref
dtype to sb3-contrib and the targets (ratio >= 10, eval >= 450) per dtype.

Threads: ``--threads N`` (default ``NUMBA_NUM_THREADS``, one per CPU) is ppo_ref's numba
threads (the trainer's ``threads``: the two LSTMs and the two towers of a pass and the Adam
step's entries run on them; the results are the same bits for every N; a quiet machine is
assumed), ``--torch-threads M``
(default 1) torch's intra-op threads (``torch.set_num_threads(M)``): on a 2-vCPU VM
sb3-contrib ran this benchmark at half the speed with two torch threads than with one
(docs/BENCHMARKS.md), so its default is its fastest setting there. ``--threads 1`` (with the
default ``--torch-threads``) runs both on one thread. OpenBLAS (NumPy) gets one thread (``OPENBLAS_NUM_THREADS=1`` unless already set):
the fast backend's passes are its own compiled kernels, the spec backend's products NumPy's.

Usage::

    python validation/bench_vs_sb3_recurrent.py [--steps 100000] [--sb3-steps N] [--seed 0]
                                                [--dtypes float64,float32] [--skip-sb3]
                                                [--no-bracket] [--spec-steps 5120] [--threads N]
                                                [--torch-threads 1]

``--sb3-steps`` trains sb3-contrib for fewer steps when its full run is too slow; its steps/s is
then measured on that shorter run (and said so in the output). The readable tier
(``PPOConfig.backend="spec"``, float64, plain NumPy) is run once on ``--spec-steps`` steps
(default 5120; 0 skips it): its steps/s stand beside the others (its returns are those of that
shorter run, not comparable with the full-length rows).
"""
from __future__ import annotations

import os

# one BLAS thread, as torch gets one thread: read by OpenBLAS when NumPy loads it
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import ppo_ref  # noqa: F401  (registers ppo_ref/CartPoleNoVel-v1)
from bench_threads import add_thread_options, apply_thread_options  # noqa: E402

ENV_ID = "ppo_ref/CartPoleNoVel-v1"
ZOO = dict(n_envs=8, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8,
           learning_rate=1e-3, clip_range=0.2, ent_coef=0.0, lstm_hidden_size=64)
EVAL_EPISODES = 20


def run_sb3(total_steps: int, seed: int, threads: int) -> dict:
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(threads)
    venv = VecNormalize(make_vec_env(ENV_ID, n_envs=ZOO["n_envs"], seed=seed,
                                     vec_env_cls=DummyVecEnv), norm_obs=True, norm_reward=False)
    lin = lambda v: (lambda progress_remaining: progress_remaining * v)  # noqa: E731
    model = RecurrentPPO(
        "MlpLstmPolicy", venv, n_steps=ZOO["n_steps"], batch_size=ZOO["batch_size"],
        n_epochs=ZOO["n_epochs"], gamma=ZOO["gamma"], gae_lambda=ZOO["gae_lambda"],
        learning_rate=lin(ZOO["learning_rate"]), clip_range=lin(ZOO["clip_range"]),
        ent_coef=ZOO["ent_coef"], seed=seed, device="cpu",
        policy_kwargs=dict(ortho_init=False, activation_fn=torch.nn.ReLU,
                           lstm_hidden_size=ZOO["lstm_hidden_size"], enable_critic_lstm=True,
                           net_arch=dict(pi=[64], vf=[64])))
    t0 = time.perf_counter()
    model.learn(total_timesteps=total_steps)
    wall = time.perf_counter() - t0
    returns = [ep["r"] for ep in model.ep_info_buffer][-20:]
    eval_env = VecNormalize(make_vec_env(ENV_ID, n_envs=1, seed=seed + 1000,
                                         vec_env_cls=DummyVecEnv), norm_obs=True, norm_reward=False)
    eval_env.obs_rms = venv.obs_rms
    eval_env.training = False
    mean_eval, std_eval = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES,
                                          deterministic=True)
    return dict(steps=model.num_timesteps, wall=wall, fps=model.num_timesteps / wall,
                final=float(np.mean(returns)), eval_mean=float(mean_eval), eval_std=float(std_eval))


def ppo_ref_config(compute_dtype: str = "float64", backend: str = "fast"):
    from ppo_ref.config import PPOConfig
    return PPOConfig.zoo_cartpole().replace(
        lstm_hidden_size=ZOO["lstm_hidden_size"], lstm_shared=False, net_arch=(64,),
        activation="relu", normalize_observations=True, compute_dtype=compute_dtype,
        backend=backend)


def run_ppo_ref(total_steps: int, seed: int, compute_dtype: str = "float64",
                backend: str = "fast", threads: int = 1) -> dict:
    from ppo_ref import RecurrentPPOTrainer

    config = ppo_ref_config(compute_dtype, backend)
    # warm-up: compile (or load cached) numba kernels outside the timed run
    RecurrentPPOTrainer(ENV_ID, config, seed=seed + 12345, threads=threads).learn(2 * 8 * 32)
    trainer = RecurrentPPOTrainer(ENV_ID, config, seed=seed, threads=threads)
    t0 = time.perf_counter()
    trainer.learn(total_steps)
    wall = time.perf_counter() - t0
    returns = list(trainer.recent_returns)[-20:]
    eval_returns = trainer.evaluate(EVAL_EPISODES, deterministic=True, seed=seed + 1000)
    return dict(steps=trainer.num_timesteps, wall=wall, fps=trainer.num_timesteps / wall,
                final=float(np.mean(returns)), eval_mean=float(np.mean(eval_returns)),
                eval_std=float(np.std(eval_returns)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--sb3-steps", type=int, default=None,
                    help="train sb3-contrib for this many steps instead (speed extrapolated)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtypes", default="float64,float32",
                    help="comma-separated PPOConfig.compute_dtype values to run ppo_ref with")
    ap.add_argument("--skip-sb3", action="store_true")
    ap.add_argument("--no-bracket", action="store_true",
                    help="do not time ppo_ref again after sb3-contrib (see the module docstring)")
    ap.add_argument("--spec-steps", type=int, default=5120,
                    help="steps of the spec-backend (readable tier) run; 0 skips it")
    add_thread_options(ap, "sb3-contrib")
    args = ap.parse_args(argv)
    apply_thread_options(ap, args)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]

    ours = {}
    for dtype in dtypes:
        ours[dtype] = run_ppo_ref(args.steps, args.seed, dtype, threads=args.threads)
        print(f"ppo_ref {dtype} done: {ours[dtype]}", flush=True)
    theirs = None
    if not args.skip_sb3:
        sb3_steps = args.sb3_steps or args.steps
        theirs = run_sb3(sb3_steps, args.seed, args.torch_threads)
        print(f"sb3-contrib done: {theirs}", flush=True)
        if not args.no_bracket:
            # A-B-A: time ppo_ref again after sb3-contrib's long run, so that a drift of the
            # machine's speed during it moves both sides; the same seed replays the same run
            for dtype in dtypes:
                again = run_ppo_ref(args.steps, args.seed, dtype, threads=args.threads)
                print(f"ppo_ref {dtype} again: {again}", flush=True)
                first = ours[dtype]
                if (again["final"], again["eval_mean"]) != (first["final"], first["eval_mean"]):
                    raise RuntimeError(f"ppo_ref {dtype}: the second run did not reproduce the "
                                       f"first ({again} vs {first})")
                first["fps_runs"] = (first["fps"], again["fps"])
                first["wall"] = (first["wall"] + again["wall"]) / 2
                first["fps"] = first["steps"] / first["wall"]

    rows = [("ppo_ref LSTM", dtype, r) for dtype, r in ours.items()]
    if args.spec_steps > 0:
        spec = run_ppo_ref(args.spec_steps, args.seed, "float64", backend="spec",
                           threads=args.threads)
        print(f"ppo_ref spec done: {spec}", flush=True)
        rows.append(("ppo_ref LSTM, backend spec", "float64", spec))
    if theirs is not None:
        rows.append(("sb3-contrib RecurrentPPO", "float32 (torch)", theirs))
    print()
    print(f"{ENV_ID}, zoo ppo_lstm settings, seed {args.seed}, threads: ppo_ref numba "
          f"{args.threads}, torch {args.torch_threads}, OpenBLAS "
          f"{os.environ['OPENBLAS_NUM_THREADS']}")
    print(f"| learner | dtype | env steps | wall s | steps/s | final return (last 20) | "
          f"deterministic eval ({EVAL_EPISODES} ep) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, dtype, r in rows:
        print(f"| {name} | {dtype} | {r['steps']} | {r['wall']:.1f} | {r['fps']:.0f} | "
              f"{r['final']:.1f} | {r['eval_mean']:.1f} +- {r['eval_std']:.1f} |")
    if theirs is not None:
        note = "" if theirs["steps"] >= args.steps else \
            f" (sb3-contrib steps/s measured on a {theirs['steps']}-step run)"
        print()
        for dtype, r in ours.items():
            ratio = r["fps"] / theirs["fps"]
            if "fps_runs" in r:
                before, after = r["fps_runs"]
                note_dtype = (f" (ppo_ref: mean wall of the runs before and after sb3-contrib, "
                              f"{before:.0f} and {after:.0f} steps/s)")
            else:
                note_dtype = ""
            print(f"speed ratio ppo_ref {dtype} / sb3-contrib: {ratio:.1f}x{note}{note_dtype}; "
                  f"targets: "
                  f"ratio >= 10: {'PASS' if ratio >= 10 else 'FAIL'}, eval >= 450: "
                  f"{'PASS' if r['eval_mean'] >= 450 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
