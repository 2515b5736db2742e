"""The ``ppo-ref`` command line (also ``python -m ppo_ref``).

Subcommands (each a small ``cmd_<name>(args) -> int`` function registered in
:data:`SUBCOMMANDS`; more can be added with :func:`register_subcommand`)::

    ppo-ref train [--env ID] [--policy mlp|lstm] [--total-timesteps N] [--n-envs N] [--seed S]
                  [--run-dir DIR] [--preset NAME] [--set field=value ...] [--resume DIR]
                  [--vectorization sync|async]
                  [--async --num-actors N --vtrace --broadcast-every K]
    ppo-ref eval DIR [--episodes N] [--deterministic] [--seed S]
    ppo-ref plot DIR [--output PATH]

``ppo-ref train`` with no arguments trains CartPole-v1 with ``PPOConfig.zoo_cartpole()`` for
100k steps. Trainers are looked up lazily in :data:`TRAINERS` (policy kind -> "module:Class")
so ``ppo_ref.recurrent_ppo`` and ``ppo_ref.actor_learner`` are imported only when used.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
from typing import Any, Callable, Dict, List, Optional

__all__ = ["main", "build_parser", "SUBCOMMANDS", "TRAINERS", "ASYNC_ENTRY",
           "register_subcommand", "trainer_class", "build_config"]

DEFAULT_ENV = "CartPole-v1"
DEFAULT_TIMESTEPS = 100_000

# policy kind -> "module:attribute" of a trainer class with the PPOTrainer interface
# (constructor (env_id, config, *, seed, ...), learn(total, callback), save/load, evaluate).
TRAINERS: Dict[str, str] = {
    "mlp": "ppo_ref.ppo:PPOTrainer",
    "lstm": "ppo_ref.recurrent_ppo:RecurrentPPOTrainer",
}
# --async entry point: a function (args, config, run_dir) -> int exit code, given the parsed
# arguments (env, total_timesteps, num_actors, vtrace, broadcast_every, seed, ...), the PPOConfig
# and the run directory; it may use ppo_ref.runlog.RunLogger for the run-dir files.
ASYNC_ENTRY = "ppo_ref.actor_learner:cli_train"

# subcommand name -> (configure_parser(subparser), run(args) -> int)
SUBCOMMANDS: Dict[str, Any] = {}


def register_subcommand(name: str, help: str, configure: Callable[[argparse.ArgumentParser], None],
                        run: Callable[[argparse.Namespace], int]) -> None:
    """Add a subcommand: ``configure`` adds its arguments, ``run(args)`` returns the exit code."""
    SUBCOMMANDS[name] = (help, configure, run)


def _import(target: str):
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"ppo-ref: cannot import {module_name} ({exc})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"ppo-ref: {module_name} has no {attr}") from None


def trainer_class(policy: str):
    """The trainer class for a policy kind (imported on first use)."""
    if policy not in TRAINERS:
        raise SystemExit(f"ppo-ref: unknown policy {policy!r}; choose from {sorted(TRAINERS)}")
    return _import(TRAINERS[policy])


def _trainer_class_by_name(name: str):
    for target in TRAINERS.values():
        if target.endswith(":" + name):
            return _import(target)
    raise SystemExit(f"ppo-ref: the checkpoint holds an unknown trainer {name!r}")


def build_config(env_id: str, preset: Optional[str], overrides: List[str], n_envs: Optional[int]):
    """The PPOConfig for ``train``: ``zoo_cartpole()`` for CartPole-v1 (or ``--preset zoo``),
    ``PPOConfig.preset(name)`` for a named preset, ``PPOConfig()`` otherwise; then ``--n-envs``
    and every ``--set field=value`` (typed by :func:`ppo_ref.config.parse_overrides`)."""
    from ppo_ref.config import PPOConfig, parse_overrides
    changes = parse_overrides(overrides or [])
    if n_envs is not None:
        changes["n_envs"] = int(n_envs)
    if preset is None:
        preset = "zoo" if env_id == DEFAULT_ENV else "default"
    if preset == "zoo":
        return PPOConfig.zoo_cartpole(**changes)
    if preset == "default":
        return PPOConfig(**changes)
    return PPOConfig.preset(preset, **changes)


# -- train ------------------------------------------------------------------------------------

def _configure_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, help=f"gymnasium id (default {DEFAULT_ENV})")
    p.add_argument("--policy", default=None, choices=sorted(TRAINERS), help="mlp (default) or lstm")
    p.add_argument("--total-timesteps", type=int, default=None,
                   help=f"train until this many env steps (default {DEFAULT_TIMESTEPS}; "
                        "with --resume: the checkpoint's target)")
    p.add_argument("--n-envs", type=int, default=None, help="parallel envs (overrides the config)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-dir", default=None,
                   help="output directory (default runs/<env>-<policy>-seed<S>-<timestamp>)")
    p.add_argument("--preset", default=None,
                   help="config base: zoo (CartPole-v1 default), default (SB3 defaults), "
                        "reference, sb3, cleanrl, thrust")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a PPOConfig field (repeatable), e.g. --set n_epochs=10")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run in DIR from its checkpoint.npz (exactly)")
    p.add_argument("--vectorization", default="sync", choices=["sync", "async"],
                   help="gymnasium SyncVectorEnv (default) or AsyncVectorEnv")
    p.add_argument("--checkpoint-every", type=float, default=60.0, metavar="SECONDS",
                   help="write checkpoint.npz at least this often (and at the end)")
    p.add_argument("--progress-every", type=float, default=2.0, metavar="SECONDS")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    g = p.add_argument_group("asynchronous actor-learner (--async)")
    g.add_argument("--async", dest="use_async", action="store_true",
                   help="train with the actor-learner loop (ppo_ref.actor_learner)")
    g.add_argument("--num-actors", type=int, default=4)
    g.add_argument("--vtrace", action="store_true", help="V-trace off-policy correction")
    g.add_argument("--broadcast-every", type=int, default=1, help="updates between policy broadcasts")


class _SigintStopper:
    """First Ctrl-C: stop at the next rollout boundary (exact checkpoint). Second: interrupt now
    (the last boundary's snapshot is saved)."""

    def __init__(self, logger):
        self.logger = logger
        self.previous = None

    def __enter__(self):
        try:
            self.previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not in the main thread
            self.previous = None
        return self

    def _handle(self, signum, frame):
        if self.logger.stop_requested:
            raise KeyboardInterrupt
        self.logger.request_stop()
        print("\nppo-ref: stopping at the end of this update (Ctrl-C again to stop now)",
              file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


def run_training(trainer, logger, total_timesteps: int) -> int:
    """Drive ``trainer.learn`` with ``logger``: checkpoints at the end, on Ctrl-C and on env
    errors (the last good rollout boundary). Returns the exit code (0, 130 interrupted, 3 env
    error). Reusable by the recurrent and actor-learner entry points."""
    from ppo_ref.rollout import EnvStepError
    logger.begin(trainer)
    code = 0
    try:
        with _SigintStopper(logger):
            trainer.learn(total_timesteps, callback=logger.callback)
    except EnvStepError as exc:
        path = logger.save_last_good(trainer)
        where = f"saved the last good checkpoint to {path}" if path else "no update had completed: nothing saved"
        print(f"ppo-ref: environment error: {exc}\nppo-ref: {where}", file=sys.stderr)
        logger.close()
        return 3
    except KeyboardInterrupt:
        path = logger.save_last_good(trainer)
        print(f"\nppo-ref: interrupted; checkpoint of the last completed update: {path}",
              file=sys.stderr)
        logger.close()
        return 130
    logger.save(trainer)
    if logger.stop_requested:
        code = 130
        print(f"ppo-ref: stopped at {trainer.num_timesteps} steps; resume with "
              f"ppo-ref train --resume {logger.run_dir}", file=sys.stderr)
    logger.close()
    return code


def cmd_train(args: argparse.Namespace) -> int:
    from ppo_ref.checkpoint import load_checkpoint
    from ppo_ref.runlog import RunLogger, default_run_dir
    if args.resume:
        run_dir = args.resume
        path = os.path.join(run_dir, "checkpoint.npz")
        _, meta = load_checkpoint(path)
        cls = _trainer_class_by_name(meta.get("trainer", ""))
        trainer = cls.load(path)
        total = args.total_timesteps if args.total_timesteps is not None else int(meta["total_timesteps"])
        if meta.get("exact_resume_limits"):
            print(f"ppo-ref: warning: env state not fully restorable ({meta['exact_resume_limits']}); "
                  "the resumed run is not bit-identical to an uninterrupted one", file=sys.stderr)
        run_info = {"trainer": meta.get("trainer"), "env_id": meta.get("env_id")}
        resume_from = {"n_updates": trainer.n_updates, "num_timesteps": trainer.num_timesteps}
        print(f"ppo-ref: resuming {run_dir} at {trainer.num_timesteps} steps, target {total}")
    else:
        env_id = args.env or DEFAULT_ENV
        policy = args.policy or "mlp"
        config = build_config(env_id, args.preset, args.overrides, args.n_envs)
        total = args.total_timesteps if args.total_timesteps is not None else DEFAULT_TIMESTEPS
        run_dir = args.run_dir or default_run_dir(env_id, "async" if args.use_async else policy, args.seed)
        if args.use_async:
            entry = _import(ASYNC_ENTRY)
            return int(entry(args, config, run_dir))
        cls = trainer_class(policy)
        kwargs = {"seed": args.seed}
        if args.vectorization != "sync":
            kwargs["vectorization"] = args.vectorization
        trainer = cls(env_id, config, **kwargs)
        run_info = {"trainer": type(trainer).__name__, "policy": policy, "env_id": env_id,
                    "seed": args.seed, "total_timesteps": total, "vectorization": args.vectorization,
                    "config": config.to_dict(), "argv": sys.argv[1:]}
        resume_from = None
        print(f"ppo-ref: training {policy} on {env_id} for {total} steps (seed {args.seed}) -> {run_dir}")
    logger = RunLogger(run_dir, run_info, resume_from=resume_from, progress_every=args.progress_every,
                       checkpoint_every=args.checkpoint_every, quiet=args.quiet)
    try:
        return run_training(trainer, logger, total)
    finally:
        close = getattr(trainer, "close", None)
        if close is not None:
            close()


# -- eval -------------------------------------------------------------------------------------

def _configure_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="DIR", help="a run directory (or a checkpoint .npz)")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--deterministic", action="store_true", help="act with the mode (argmax / mean)")
    p.add_argument("--seed", type=int, default=10_000, help="episode i is reset with seed + i")


def _checkpoint_path(path: str) -> str:
    return path if path.endswith(".npz") else os.path.join(path, "checkpoint.npz")


def cmd_eval(args: argparse.Namespace) -> int:
    import numpy as np
    from ppo_ref.checkpoint import load_checkpoint
    path = _checkpoint_path(args.run_dir)
    _, meta = load_checkpoint(path)
    cls = _trainer_class_by_name(meta.get("trainer", ""))
    trainer = cls.load(path)
    try:
        returns = trainer.evaluate(args.episodes, deterministic=args.deterministic, seed=args.seed)
    finally:
        trainer.close()
    mode = "deterministic" if args.deterministic else "stochastic"
    print(f"{meta.get('env_id')}: {len(returns)} episodes ({mode}) after {meta.get('num_timesteps')} "
          f"steps: mean return {np.mean(returns):.2f} +- {np.std(returns):.2f} (std)")
    return 0


# -- plot -------------------------------------------------------------------------------------

def _configure_plot(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="DIR")
    p.add_argument("--output", default=None, help="PNG path (default DIR/learning_curve.png)")


def cmd_plot(args: argparse.Namespace) -> int:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("ppo-ref plot needs matplotlib: pip install 'ppo_ref[plot]'", file=sys.stderr)
        return 2
    import numpy as np
    from ppo_ref.runlog import read_csv
    episodes_path = os.path.join(args.run_dir, "episodes.csv")
    metrics_path = os.path.join(args.run_dir, "metrics.csv")
    if not os.path.exists(episodes_path) or not os.path.exists(metrics_path):
        print(f"ppo-ref plot: {args.run_dir} has no episodes.csv / metrics.csv", file=sys.stderr)
        return 2
    ep = read_csv(episodes_path)
    mx = read_csv(metrics_path)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    if ep:
        ax.plot(ep["timesteps"], ep["return"], ".", alpha=0.25, markersize=3, label="episode")
        r = ep["return"]
        rolling = np.array([r[max(0, i - 19):i + 1].mean() for i in range(len(r))])
        ax.plot(ep["timesteps"], rolling, label="mean of last 20")
        ax.legend()
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.set_title("learning curve")
    if mx:
        axes[1].plot(mx["timesteps"], mx["approx_kl"], label="approx_kl")
        axes[1].plot(mx["timesteps"], mx["clip_fraction"], label="clip_fraction")
        axes[1].set_xlabel("env steps")
        axes[1].legend()
        axes[2].plot(mx["timesteps"], mx["explained_variance"], label="explained_variance")
        axes[2].plot(mx["timesteps"], mx["entropy"], label="entropy")
        axes[2].set_xlabel("env steps")
        axes[2].legend()
    title = os.path.basename(os.path.normpath(args.run_dir))
    fig.suptitle(title)
    fig.tight_layout()
    out = args.output or os.path.join(args.run_dir, "learning_curve.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"wrote {out}")
    return 0


register_subcommand("train", "train a policy (default: CartPole-v1, zoo settings, 100k steps)",
                    _configure_train, cmd_train)
register_subcommand("eval", "evaluate a run's checkpoint", _configure_eval, cmd_eval)
register_subcommand("plot", "write DIR/learning_curve.png", _configure_plot, cmd_plot)
register_subcommand("vectors", "write golden JSON test vectors (ppo_ref.vectors)",
                    lambda p: _import("ppo_ref.vectors:configure_vectors")(p),
                    lambda args: _import("ppo_ref.vectors:cli_vectors")(args))
register_subcommand("check", "check another implementation's outputs against golden vectors",
                    lambda p: _import("ppo_ref.vectors:configure_check")(p),
                    lambda args: _import("ppo_ref.vectors:cli_check")(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppo-ref", description="ppo_ref: PPO in NumPy + numba")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, configure, _) in SUBCOMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``ppo-ref`` and ``python -m ppo_ref``; returns the exit code.

    No subcommand means ``train`` with its defaults.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["train"] + argv
    args = build_parser().parse_args(argv)
    _, _, run = SUBCOMMANDS[args.command]
    try:
        return int(run(args))
    except ValueError as exc:  # bad --set values, corrupt checkpoints, ...
        print(f"ppo-ref {args.command}: error: {exc}", file=sys.stderr)
        return 2
