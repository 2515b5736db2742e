"""``ppo-ref train --async``: the actor-learner loop (:mod:`ppo_ref.distributed`) in a run
directory, and ``ppo-ref train --resume DIR`` of such a run. The run ends as a synchronous one
does (:func:`ppo_ref.cli.train.run_training`); its checkpoint is a PPOTrainer's (``ppo-ref eval``
works on it) whose metadata adds ``actor_learner``: the loop's settings and the policy version
to continue from."""
from __future__ import annotations

import json
from typing import Any, Dict, Optional

from ppo_ref.cli.common import (MAX_NUM_ACTORS, UsageError, building, read_run_info,
                                rollout_note, user_input)
from ppo_ref.config import PPOConfig
from ppo_ref.distributed import (AsyncActorLearnerConfig, UpdateInfo, async_config_from_ppo,
                                 learner_loop, make_learner)
from ppo_ref.train.ppo import PPOTrainer

__all__ = ["cli_async_config", "cli_train", "cli_resume", "cli_restart"]


def cli_async_config(args, ppo: PPOConfig) -> AsyncActorLearnerConfig:
    """The actor-learner configuration of ``ppo-ref train --async`` (``args.total_timesteps``,
    ``num_actors``, ``vtrace``, ``broadcast_every``, ``seed``, ``actors`` (None: "process"),
    ``ray_address``); :class:`UsageError` naming what it refuses (before any run directory)."""
    with user_input("--async"):
        return async_config_from_ppo(
            ppo, num_actors=args.num_actors, total_timesteps=args.total_timesteps,
            use_vtrace=args.vtrace, broadcast_every=args.broadcast_every, seed=args.seed,
            actors=args.actors or "process", ray_address=args.ray_address)


def cli_train(args, config: AsyncActorLearnerConfig, trainer, run_dir: str) -> int:
    """``ppo-ref train --async`` of :func:`cli_async_config`'s ``config`` with its learner
    ``trainer`` (:func:`~ppo_ref.distributed.make_learner`) into ``run_dir`` on ``args.env``;
    the progress line adds the policy lag. Returns the exit code."""
    env_id, total = args.env, args.total_timesteps
    run_info = {"trainer": type(trainer).__name__, "policy": "mlp", "mode": "async",
                "env_id": env_id, "seed": args.seed, "total_timesteps": total,
                "actor_learner": config.to_dict(), "config": trainer.config.to_dict(),
                "argv": args.argv}
    print(f"ppo-ref: training mlp on {env_id} with {config.num_actors} {config.actors} "
          f"actors ({config.n_steps} steps each per update, "
          f"{'V-trace' if config.use_vtrace else 'GAE'}, broadcast every "
          f"{config.broadcast_every}) for {total} steps (seed {args.seed}) -> {run_dir}")
    return _run(args, trainer, config, run_dir, run_info, None, total, 0)


def cli_resume(args, run_dir: str, path: str, meta: Dict[str, Any], total: int) -> int:
    """``ppo-ref train --resume DIR`` of an ``--async`` run: the learner continues exactly from
    the checkpoint and its policy version; new actors start from that version with advanced
    seeds (:func:`ppo_ref.distributed.resumed_actors_config`). What they collect is new
    experience (docs/specification.md, "Resuming an actor-learner run")."""
    saved = meta.get("actor_learner")
    done = int(meta["num_timesteps"])
    source = f"checkpoint {path!r}"
    if not isinstance(saved, dict):  # a checkpoint from before resumable --async runs
        saved = {"config": read_run_info(run_dir).get("actor_learner")}
    config = _saved_async_config(saved.get("config"), total - done, source)
    version = saved.get("policy_version")
    if version is None:  # the version of the parameters after n_updates updates
        version = -(-int(meta["n_updates"]) // config.broadcast_every)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise UsageError(f"{source}: actor_learner.policy_version must be an integer >= 0, got "
                         f"{version!r}")
    with building(f"--resume {run_dir}"):
        trainer = PPOTrainer.load(path)
    run_info = {"trainer": meta.get("trainer"), "env_id": trainer.env_id,
                "total_timesteps": total, "argv": args.argv}
    resume_from = {"n_updates": trainer.n_updates, "num_timesteps": trainer.num_timesteps}
    print(f"ppo-ref: resuming {run_dir} at {done} steps, target {total}: the learner continues "
          f"from policy version {version}; {config.num_actors} new {config.actors} actors "
          f"start from it with advanced seeds")
    return _run(args, trainer, config, run_dir, run_info, resume_from, total, version)


def cli_restart(args, run_dir: str, info: Dict[str, Any], total: int) -> int:
    """``ppo-ref train --resume DIR`` of an ``--async`` run without a checkpoint: the run again
    from step 0 with its saved settings."""
    config = _saved_async_config(info.get("actor_learner"), total,
                                 f"--resume {run_dir}: config.json")
    with building(f"cannot train mlp on {info['env_id']}"):
        trainer = make_learner(config, info["env_id"])
    run_info = {key: info[key] for key in ("trainer", "policy", "mode", "env_id", "seed",
                                           "actor_learner", "config", "argv", "run_id")
                if key in info}
    run_info.update(total_timesteps=total, restart_argv=[args.argv])
    print(f"ppo-ref: {run_dir} has no checkpoint (no update was saved): starting its "
          f"actor-learner run from scratch with its saved settings for {total} steps")
    return _run(args, trainer, config, run_dir, run_info, None, total, 0)


def _saved_async_config(saved: Any, total: int, source: str) -> AsyncActorLearnerConfig:
    """The saved actor-learner settings with ``total_timesteps`` what is left to train; one
    :class:`UsageError` line otherwise."""
    if not isinstance(saved, dict):
        raise UsageError(f"{source}: the actor-learner settings are not recorded")
    d = json.loads(json.dumps(saved))
    d["total_timesteps"] = max(int(total), 1)
    with user_input(f"{source}: bad actor-learner settings"):
        config = AsyncActorLearnerConfig.from_dict(d)
    if config.num_actors > MAX_NUM_ACTORS:
        raise UsageError(f"{source}: num_actors must be in [1, {MAX_NUM_ACTORS}], got "
                         f"{config.num_actors}")
    return config


def _run(args, trainer, config: AsyncActorLearnerConfig, run_dir: str, run_info: Dict[str, Any],
         resume_from: Optional[Dict[str, int]], total: int, start_version: int) -> int:
    """Train with :func:`ppo_ref.distributed.learner_loop` on ``trainer.env_id`` in the run
    directory (:func:`ppo_ref.cli.train.train_in_run_dir`) after the rollout note of an update
    (the learner's n_envs is num_actors); each checkpoint records the policy version a resume
    continues from."""
    from ppo_ref.cli.train import train_in_run_dir
    rollout_note(trainer.config, trainer.num_timesteps, total, unit="update",
                 factors="num_actors*n_steps")

    def prepare(logger):
        version = {"current": start_version}  # of the learner's parameters: broadcast first
        lag = {"mean": float("nan"), "max": 0}
        saved_config = config.to_dict()
        logger.extra_metadata = lambda: {"actor_learner": {"policy_version": version["current"],
                                                           "config": saved_config}}
        logger.progress_suffix = lambda: (f" | policy lag mean {lag['mean']:.2f} max "
                                          f"{lag['max']}")

        def on_update(info: UpdateInfo):
            stats = dict(info.stats, fps=info.env_steps / max(info.wall_seconds, 1e-12),
                         progress_remaining=trainer.progress_remaining)
            version["current"] = info.version + 1  # broadcast as that, or newer than info's
            lag.update(mean=info.policy_lag_mean, max=info.policy_lag_max)
            return logger.callback(trainer, stats)

        def learn() -> str:
            _, report = learner_loop(config, trainer, trainer.env_id, callback=on_update,
                                     start_version=start_version)
            lags = report.policy_lag_mean or [float("nan")]  # per update (of as many rows)
            mean = sum(lags) / len(lags)
            return (f"{report.steps_per_second:.0f} steps/s, policy lag mean {mean:.2f} over "
                    f"{report.updates} updates (the last {lags[-1]:.2f}) max "
                    f"{max(report.policy_lag_max, default=0)}, {report.broadcasts} broadcasts")
        return learn

    return train_in_run_dir(args, trainer, run_dir, json.loads(json.dumps(run_info)),
                            resume_from, total, prepare=prepare)
