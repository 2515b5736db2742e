"""Train every environment of the zoo table (``ppo_ref/zoo.py``) with its default settings.

For each entry (or the ``--envs`` chosen): ``ppo-ref train --env ID`` with no other setting
(the entry's policy and settings, seed 0 by default, the entry's ``n_timesteps`` or the smaller
budget ``--timesteps`` states), run through the command line into a temporary run directory;
then a deterministic evaluation of ``--eval-episodes`` episodes on fresh seeds (``ppo-ref
eval --deterministic``, as rl-baselines3-zoo's ``benchmark.md`` evaluates). Prints one table
row per env: steps trained, the mean return of the last 20 training episodes, the deterministic
evaluation mean +- std, the wall time, and the published figure of the entry's source
(``benchmark.md`` mean reward, or n/a).

Usage::

    python validation/zoo_check.py                                  # every entry
    python validation/zoo_check.py --envs CartPole-v1 Acrobot-v1 --timesteps Acrobot-v1=200000
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time

import numpy as np


def train_and_evaluate(env_id: str, timesteps: int, seed: int, eval_episodes: int):
    """``(last-20 mean return, eval mean, eval std, wall seconds, steps)`` of one default run."""
    from ppo_ref import cli
    from ppo_ref.io.checkpoint import load_checkpoint
    from ppo_ref.io.runlog import mean_last, read_csv
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        argv = ["train", "--env", env_id, "--seed", str(seed), "--run-dir", run_dir, "--quiet",
                "--total-timesteps", str(timesteps)]
        start = time.perf_counter()
        code = cli.main(argv)
        wall = time.perf_counter() - start
        if code != 0:
            raise SystemExit(f"zoo_check: {' '.join(argv)} exited {code}")
        episodes = read_csv(os.path.join(run_dir, "episodes.csv"))
        last20 = mean_last(episodes.get("return", []), 20)
        _, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.npz"))
        with open(os.path.join(run_dir, "config.json")) as fh:
            policy = json.load(fh)["policy"]
        trainer = cli.trainer_class(policy).load(os.path.join(run_dir, "checkpoint.npz"))
        try:
            returns = np.asarray(trainer.evaluate(eval_episodes, deterministic=True,
                                                  seed=10_000))
        finally:
            trainer.close()
        return last20, float(returns.mean()), float(returns.std()), wall, int(meta["num_timesteps"])


def main(argv=None) -> int:
    from ppo_ref.zoo import ZOO
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", nargs="*", default=list(ZOO), help="env ids (default: all entries)")
    p.add_argument("--timesteps", nargs="*", default=[], metavar="ENV=N",
                   help="a smaller budget for an env (default: its entry's n_timesteps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-episodes", type=int, default=20)
    args = p.parse_args(argv)
    budgets = {}
    for item in args.timesteps:
        env_id, _, n = item.rpartition("=")
        budgets[env_id] = int(n)
    unknown = [env_id for env_id in list(args.envs) + list(budgets) if env_id not in ZOO]
    if unknown:
        p.error(f"no zoo entry for {unknown}; entries: {list(ZOO)}")
    print(f"seed {args.seed}, deterministic evaluation over {args.eval_episodes} episodes "
          f"(seeds 10000+)")
    print("| env | policy | source | steps (zoo n_timesteps) | return, last 20 training episodes "
          "| deterministic eval | wall s | published (source) |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for env_id in args.envs:
        entry = ZOO[env_id]
        budget = budgets.get(env_id, entry.n_timesteps)
        with contextlib.redirect_stdout(io.StringIO()):
            last20, mean, std, wall, steps = train_and_evaluate(env_id, budget, args.seed,
                                                                args.eval_episodes)
        published = entry.published_source if entry.published is None \
            else f"{entry.published:.2f} ({entry.published_source})"
        print(f"| {env_id} | {entry.policy} | {entry.source} | {steps} ({entry.n_timesteps}) | "
              f"{last20:.2f} | {mean:.2f} +- {std:.2f} | {wall:.1f} | {published} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
