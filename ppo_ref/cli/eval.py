"""``ppo-ref eval DIR``: episodes of a run's checkpoint, mean return and its spread."""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from ppo_ref._checks import one_line
from ppo_ref.cli.common import (CHECKPOINT_EVERY_DEFAULT, MAX_EPISODES, MAX_SEED, UsageError,
                                building, check_same_run, close_quickly, probe_env,
                                read_run_info, saved_config, trainer_class_by_name, user_input)
from ppo_ref.cli.seeds import seeds_hint
from ppo_ref.io.checkpoint import check_env_import, load_checkpoint, vet_checkpoint_metadata

__all__ = ["configure_eval", "cmd_eval"]

def configure_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="DIR", help="a run directory (or a checkpoint .npz)")
    p.add_argument("--episodes", type=int, default=10,
                   help=f"number of episodes (1 to {MAX_EPISODES})")
    p.add_argument("--deterministic", action="store_true", help="act with the mode (argmax / mean)")
    p.add_argument("--seed", type=int, default=10_000,
                   help="episode i is reset with seed + i (seed >= 0)")
    p.add_argument("--allow-import", action="store_true",
                   help="let a checkpoint's env id module:EnvId import (run) its module")


def cmd_eval(args: argparse.Namespace) -> int:
    if not 1 <= args.episodes <= MAX_EPISODES:
        raise UsageError(f"--episodes must be in [1, {MAX_EPISODES}], got {args.episodes}")
    if not 0 <= args.seed <= MAX_SEED + 1 - args.episodes:
        raise UsageError(f"--seed must be in [0, 2**63 - episodes] (episode i is reset with "
                         f"seed + i), got {args.seed}")
    path = args.run_dir if args.run_dir.endswith(".npz") else \
        os.path.join(args.run_dir, "checkpoint.npz")
    if os.path.isfile(args.run_dir) and path != args.run_dir:
        raise UsageError(f"{args.run_dir} is a file: give a run directory or a checkpoint .npz")
    if os.path.isdir(args.run_dir) and not os.path.exists(path):
        if hint := seeds_hint(args.run_dir):
            raise UsageError(f"{args.run_dir} holds no checkpoint.npz{hint}")
        raise UsageError(f"{args.run_dir} holds no checkpoint.npz yet: a run writes it every "
                         f"--checkpoint-every seconds (default "
                         f"{CHECKPOINT_EVERY_DEFAULT:g}), when stopped and at the end")
    with user_input():
        _, meta = load_checkpoint(path)
        vet_checkpoint_metadata(meta, f"checkpoint {path!r}")
        check_env_import(meta.get("env_id"), args.allow_import, f"checkpoint {path!r}")
    if path != args.run_dir:  # a run directory: its checkpoint must be its run's
        try:
            info = read_run_info(args.run_dir)
        except UsageError:  # eval needs nothing from a damaged config.json
            info = {}
        check_same_run(args.run_dir, info, meta, f"eval {args.run_dir}",
                       f"or evaluate that file itself: ppo-ref eval {path}")
    saved_config(meta["config"], f"checkpoint {path!r}")  # bounds, before any env is made
    cls = trainer_class_by_name(meta.get("trainer", ""))
    if meta.get("env_id") is not None:
        probe_env(meta["env_id"])
    with building(f"cannot load {path}"):
        trainer = cls.load(path, allow_import=args.allow_import, env_state=False)
    try:
        returns = trainer.evaluate(args.episodes, deterministic=args.deterministic, seed=args.seed)
    except (KeyboardInterrupt, SystemError) as exc:  # numba: SystemError from a Ctrl-C
        if KeyboardInterrupt not in (type(exc), type(exc.__cause__)):
            raise
        print("ppo-ref eval: interrupted (Ctrl-C); no result", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 -- the env raised while evaluating
        print(f"ppo-ref eval: error: evaluating {path}: {type(exc).__name__}: {one_line(exc)}",
              file=sys.stderr)
        return 3
    finally:
        close_quickly(trainer, 10.0)
    mode = "deterministic" if args.deterministic else "stochastic"
    print(f"{meta.get('env_id')}: {len(returns)} episodes ({mode}) after "
          f"{meta.get('num_timesteps')} steps: mean return {np.mean(returns):.2f} +- "
          f"{np.std(returns):.2f} (std)")
    return 0
